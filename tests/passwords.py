"""The password hasher of the tests' own process.

Production's PBKDF2 costs about half a second a hash by design; the suite makes thousands of
users and logs them in. This one keeps the algorithm's name (``pbkdf2_sha256``) with few
iterations: a hash made here still verifies in the servers and workers the tests start, whose
standard hasher reads the iterations from the hash (and upgrades it at their first login).
"""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1000
