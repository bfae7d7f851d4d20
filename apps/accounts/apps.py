from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "apps.accounts"
    label = "accounts"
    verbose_name = "Accounts and API tokens"

    def ready(self):
        from apps.accounts import receivers, schema  # noqa: F401 - schema registers the bearer scheme

        receivers.connect()

        from apps.accounts import oidc
        from apps.core import ticker

        # Personal tokens end when the identity provider says their user is gone (docs/identity.md).
        ticker.register("accounts.recheck_identities", oidc.recheck_identities, every=lambda: 60)
