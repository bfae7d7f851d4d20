"""What ``manage.py doctor`` checks of a Qarnot pool beyond the shared skeleton
(``apps.backends.remote.backend``): the API with the token, the profile, the image, room for
buckets and storage."""

from __future__ import annotations

from apps.backends.base import Doctor
from apps.backends.qarnot.client import MB, Session, _sdk
from apps.backends.remote import RemoteBackend


class QarnotDoctor(RemoteBackend):
    session_class = Session
    per_user_words = "Qarnot tokens"
    per_user_checked = "; each user's token is checked when they paste it"

    def sdk_version(self) -> str:
        return f"qarnot SDK {_sdk().__version__}"

    def doctor_client(self, session: Session, doctor: Doctor) -> bool:
        def reachability():
            session.info = session.guarded("connection", lambda: session.conn.user_info)
            return "the Qarnot API answers and accepts the token"

        return doctor.check("reachability", reachability, fix="check cluster_url and the token")

    def doctor_provider(self, session: Session, doctor: Doctor) -> None:
        doctor.check("profile", lambda: _profile(session))
        doctor.check("image", lambda: _image(session.remote.get("docker_image")))
        listed = []  # the storage answered: its quota is worth a line, whatever the bucket count
        doctor.check("buckets", lambda: _buckets(session, listed))
        if listed:
            doctor.check("storage", lambda: _storage(session))


def _profile(session: Session) -> tuple[bool, str]:
    profile = session.remote.get("profile")
    profiles = session.guarded("profile listing", lambda: list(session.conn.profiles_names()))
    if profile in profiles:
        return True, f"profile {profile} is available"
    return False, f"profile {profile!r} is not offered ({', '.join(profiles)}): fix remote.profile"


def _image(image: str | None) -> tuple[bool, str] | str:
    if not image:
        return "no docker_image: the profile's default image runs cases"
    ok = " " not in image and not image.startswith(("-", ":"))
    return ok, f"image {image}" + ("" if ok else " is malformed: fix remote.docker_image")


def _buckets(session: Session, listed: list) -> tuple[bool, str]:
    listed.append(session.guarded("storage", lambda: session.s3.list_buckets()))
    info = session.info
    room = None if info.max_bucket is None or info.max_bucket < 0 else info.max_bucket - info.bucket_count
    ok = room is None or room >= 3
    message = f"room for {room} more bucket(s)" if room is not None else "no bucket limit"
    return ok, message + ("" if ok else ": a case needs 2 (3 with shared inputs); delete old buckets")


def _storage(session: Session) -> tuple[bool, str] | str:
    info = session.info
    quota, used = info.quota_bytes_bucket, info.used_quota_bytes_bucket
    if quota is None or quota < 0:
        return "no storage quota"
    left = max(0, quota - (used or 0))
    limit = int(session.remote.get("max_upload_mb") or 512)
    ok = left >= limit * MB
    tail = "" if ok else f", less than one case's max_upload_mb ({limit} MB): free storage"
    return ok, f"{left / MB:.1f} MB of storage left{tail}"
