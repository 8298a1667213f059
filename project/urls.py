from django.contrib import admin
from django.urls import path

from project.shop import views as shop

urlpatterns = [
    path("admin/", admin.site.urls),
    path("shop/quote/", shop.quote_order, name="shop-quote"),
]
