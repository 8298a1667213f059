from django.contrib import admin
from django.urls import path

import durable
from project.shop import views as shop

urlpatterns = [
    path("admin/", admin.site.urls),
    path("shop/quote/", shop.quote_order, name="shop-quote"),
    path("shop/track/<str:run_id>/", shop.track_page, name="shop-track"),
    path("shop/track/<str:run_id>/events", shop.track_events, name="shop-track-events"),
    path("shop/track/<str:run_id>/events.sync", shop.track_events_sync, name="shop-track-events-sync"),
    # Prometheus text for a scraper sending DURABLE["METRICS_TOKEN"], or a signed-in staff user.
    path("metrics/", durable.metrics_view, name="durable-metrics"),
]
