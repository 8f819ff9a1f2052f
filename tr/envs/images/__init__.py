"""Docker images built on this machine, no registry: the ``tr-base`` image made from the host's own
Debian packages, and task images built from a task's Dockerfile on top of it.

``python -m tr.envs.images`` builds (or finds) the base image and prints its tag.
"""

from tr.envs.images.base import (BASE_PACKAGES, BASE_REPO, base_image_tag, build_task_image,
                                 ensure_base_image)

__all__ = ["BASE_PACKAGES", "BASE_REPO", "base_image_tag", "build_task_image",
           "ensure_base_image"]
