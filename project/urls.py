from django.contrib import admin
from django.urls import path

import durable
from project.shop import views as shop

urlpatterns = [
    path("admin/", admin.site.urls),
    path("shop/quote/", shop.quote_order, name="shop-quote"),
    # Prometheus text for a scraper sending DURABLE["METRICS_TOKEN"], or a signed-in staff user.
    path("metrics/", durable.metrics_view, name="durable-metrics"),
]
