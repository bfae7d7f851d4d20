import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from config.env import require_allowed_hosts

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_asgi_application()
require_allowed_hosts(settings.DEBUG, settings.ALLOWED_HOSTS)  # fail at start, not 400 per request
