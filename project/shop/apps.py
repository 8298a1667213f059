from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "project.shop"
    label = "shop"
