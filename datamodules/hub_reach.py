"""Whether a hub dataset that the data catalog does not map can be read at all: in the local
``datasets``/hub cache, or from a hub that answers. Checked before anything runs, so that an
offline study fails in one line instead of after its first runs."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ablate.datamodules.catalog import ENV, active_catalog
from ablate.lightning_modules.config.errors import DataError

PROBE_S = 3.0
"""How long the hub is given to answer once per process."""


@functools.cache
def hub_answers() -> bool:
    """Whether the Hugging Face hub can be reached (False in offline mode: ``HF_HUB_OFFLINE``,
    ``HF_DATASETS_OFFLINE``); asked once per process."""
    from huggingface_hub import constants

    if constants.is_offline_mode() or os.environ.get("HF_DATASETS_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return False
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=PROBE_S)
    except urllib.error.HTTPError:  # it answered (with an error status): reachable
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True


def cached(name: str) -> bool:
    """Whether the hub dataset ``name`` (``owner/name``, its config left out) is in the local caches:
    ``datasets``' (a prepared copy) or the hub's (downloaded files)."""
    from datasets import config
    from huggingface_hub import constants

    repo = name.split(":", 1)[0]
    prepared = Path(config.HF_DATASETS_CACHE) / repo.replace("/", "___")
    downloaded = Path(constants.HF_HUB_CACHE) / f"datasets--{repo.replace('/', '--')}"
    return prepared.is_dir() or downloaded.is_dir()


def check_reachable(key: str, name: str) -> None:
    """A hub dataset ``key`` names (``name``, not mapped by the data catalog) is cached or the hub answers.

    Raises:
        DataError: neither, naming ``key`` and the catalog to map it in.
    """
    if cached(name) or hub_answers():
        return
    catalog = active_catalog()
    where = f"the data catalog {catalog.file}" if catalog is not None else f"a data catalog ({ENV} is not set)"
    raise DataError(
        f"{key}: {name}: not in the local cache and the hub cannot be reached (offline); map it to local "
        f"files in {where}"
    )
