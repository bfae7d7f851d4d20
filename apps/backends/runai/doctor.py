"""What ``manage.py doctor`` checks of a Run:AI pool beyond the shared skeleton
(``apps.backends.remote.backend``): the shared volume and the image (no credential needed), then
under the service credential the project, the cluster and the node pool."""

from __future__ import annotations

import os
from pathlib import Path

from apps.backends import files
from apps.backends.base import Doctor
from apps.backends.remote import RemoteBackend
from apps.backends.runai.client import Session, _api, _sdk, projects


class RunaiDoctor(RemoteBackend):
    session_class = Session
    per_user_words = "Run:AI access keys"
    per_user_checked = "; each user's key is checked when they connect"
    token_fix = "check base_url and the access key"  # noqa: S105 - advice, not a secret

    def sdk_version(self) -> str:
        from importlib.metadata import version

        _sdk()
        return f"runapy {version('runapy')}"

    def doctor_pool(self, session: Session, doctor: Doctor) -> None:
        doctor.check("shared volume", lambda: _volume(session.remote))
        image = session.remote.get("image")
        doctor.check(
            "image",
            lambda: (bool(image), f"image {image}" if image else "no image: set remote.image (cases run in it)"),
        )

    def doctor_provider(self, session: Session, doctor: Doctor) -> None:
        found = []
        doctor.check("project", lambda: _project(session, found))
        doctor.check(
            "cluster",
            lambda: _cluster(session, session.remote.get("cluster_id") or (found or [{}])[0].get("clusterId")),
        )
        doctor.check("node pool", lambda: _node_pool(session))


def _volume(remote: dict) -> tuple[bool, str]:
    root, host = remote.get("working_root"), remote.get("host_path")
    if not root or not host:
        return False, "set working_root and host_path: results come back through them"
    path = Path(root)
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        return False, f"working_root {root} is not a writable directory on this host"
    problem = files.unsafe_parent(path)
    if problem:
        return False, problem
    return True, f"{root} here is {host} on the cluster's nodes (mounted per case)"


def _project(session: Session, found: list) -> tuple[bool, str]:
    name = session.remote.get("project")
    listed = projects(session, name)
    if not name:
        names = ", ".join(p.get("name", "?") for p in listed) or "none"
        return bool(listed), f"no pool project: users choose among {names}"
    found.extend(listed[:1])
    if found:
        return True, f"project {name} is visible"
    return (
        False,
        f"project {name!r} is not visible to the credential: fix remote.project or give the service account "
        "access to it",
    )


def _cluster(session: Session, cluster) -> tuple[bool, str]:
    clusters = session.call("cluster listing", lambda c: _api().ClustersApi(c).get_clusters())
    clusters = clusters if isinstance(clusters, list) else (clusters or {}).get("clusters") or []
    match = [c for c in clusters if isinstance(c, dict) and c.get("uuid") == cluster] if cluster else clusters
    connected = [c for c in match if ((c.get("status") or {}).get("state") or "Connected") == "Connected"]
    if connected:
        return True, f"cluster {cluster or '(any)'} is connected"
    return False, f"cluster {cluster or '(any)'} is unknown or not connected: check remote.cluster_id"


def _node_pool(session: Session) -> tuple[bool, str] | str:
    node_pool = session.remote.get("node_pool")
    if not node_pool:
        return "no node pool: the project's order of node pools applies"
    body = session.call("node-pool listing", lambda c: _api().NodePoolsApi(c).get_nodepools())
    names = [p.get("name") for p in (body or {}).get("nodePools") or [] if isinstance(p, dict)]
    if node_pool in names:
        return True, f"node pool {node_pool} exists"
    return False, f"node pool {node_pool!r} is not one of {', '.join(names) or 'none'}: fix remote.node_pool"
