import os

from django.conf import settings
from django.core.wsgi import get_wsgi_application

from config.env import require_allowed_hosts

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()
require_allowed_hosts(settings.DEBUG, settings.ALLOWED_HOSTS)  # fail at start, not 400 per request
