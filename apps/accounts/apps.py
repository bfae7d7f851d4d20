from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "apps.accounts"
    label = "accounts"
    verbose_name = "Accounts and API tokens"

    def ready(self):
        from apps.accounts import receivers, schema  # noqa: F401 - schema registers the bearer scheme

        receivers.connect()
