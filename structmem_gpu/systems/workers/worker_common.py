"""What every baseline worker needs, standard library only (systems/protocol.py).

A worker runs inside the system's own virtual environment, which does not have our package:
it puts this file's directory on sys.path and imports this module by name.

    import worker_common as wc
    wc.freeze_clock(hello["clock"])   # before the system is imported
    wc.refuse_network()
    wc.seed_ids(unit)                 # at the start of every build/search
    wc.serve({"hello": ..., "build": ..., "search": ...}, system="mem0", version="1.0.5")
"""

from __future__ import annotations

import collections
import contextlib
import copyreg
import importlib
import datetime as _dt
import io
import ipaddress
import json
import logging
import os
import random
import socket
import sys
import threading
import traceback
import uuid
from collections.abc import Callable
from typing import Any

LOG_TAIL_LINES = 40

# --------------------------------------------------------------------------- frozen clock

_REAL_DATETIME = _dt.datetime
_REAL_DATE = _dt.date


_IMPORT_BEFORE_FREEZE = ("pydantic.v1", "pandas", "pyarrow.dataset", "pyarrow.parquet")


class _RealInstances(type):
    """Metaclass of the frozen classes: instances of the REAL datetime/date (made by C code such
    as pydantic-core, or by modules that imported the real class before the freeze) still pass
    `isinstance(x, datetime.datetime)` once `datetime.datetime` is the frozen subclass."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls._real)  # type: ignore[attr-defined]

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._real)  # type: ignore[attr-defined]


def freeze_clock(iso: str) -> None:
    """`datetime.datetime.now()/utcnow()/today()` and `datetime.date.today()` return `iso` from
    now on (a naive instant is read as UTC, as if the worker ran with TZ=UTC). Call it BEFORE
    the system is imported: modules that do `from datetime import datetime` bind the class at
    import, and prompts built in module-level f-strings (mem0's "Today's date is ...") are
    evaluated then. `time.time()` is left alone: timeouts, retries and log stamps need it.

    The classes in the `datetime` module are replaced by subclasses (the module's attributes are
    writable; the C types' methods are not). Values they construct are of the subclass, which
    behaves as datetime; the metaclass keeps isinstance checks true for real instances."""
    # Libraries that subclass or size-check the date classes at import break once they are
    # replaced (pydantic.v1: a metaclass conflict; pandas: hangs; pyarrow's compiled modules:
    # "datetime.date size changed"); none reads the clock at import, so they load first.
    for name in _IMPORT_BEFORE_FREEZE:
        try:
            importlib.import_module(name)
        except ImportError:
            continue  # not in this system's environment
    frozen = _REAL_DATETIME.fromisoformat(iso)
    if frozen.tzinfo is None:
        frozen = frozen.replace(tzinfo=_dt.UTC)
    frozen_utc = frozen.astimezone(_dt.UTC)

    class FrozenDateTime(_REAL_DATETIME, metaclass=_RealInstances):
        _real = _REAL_DATETIME

        @classmethod
        def now(cls, tz: _dt.tzinfo | None = None) -> _dt.datetime:
            if tz is None:
                return cls._make(frozen_utc.replace(tzinfo=None))
            return cls._make(frozen_utc.astimezone(tz))

        @classmethod
        def utcnow(cls) -> _dt.datetime:
            return cls._make(frozen_utc.replace(tzinfo=None))

        @classmethod
        def today(cls) -> _dt.datetime:
            return cls.now()

        @classmethod
        def _make(cls, d: _dt.datetime) -> _dt.datetime:
            # astimezone with a pytz zone returns that zone's datetime: rebuild as ours
            return cls(d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond,
                       d.tzinfo, fold=d.fold)

    class FrozenDate(_REAL_DATE, metaclass=_RealInstances):
        _real = _REAL_DATE

        @classmethod
        def today(cls) -> _dt.date:
            d = frozen_utc.date()
            return cls(d.year, d.month, d.day)

    FrozenDateTime.__name__ = FrozenDateTime.__qualname__ = "datetime"
    FrozenDate.__name__ = FrozenDate.__qualname__ = "date"
    FrozenDateTime.__module__ = FrozenDate.__module__ = "datetime"
    _dt.datetime = FrozenDateTime  # type: ignore[misc]
    _dt.date = FrozenDate  # type: ignore[misc]
    # pickle saves a class by its name and refuses one that is not what the name now finds:
    # real instances (made by C code) are pickled as the frozen class (same state), so stores
    # that pickle (qdrant's local mode) still work. Unpickled without a freeze: the real class.
    copyreg.pickle(_REAL_DATETIME, lambda d: (FrozenDateTime, d.__reduce__()[1]))
    copyreg.pickle(_REAL_DATE, lambda d: (FrozenDate, d.__reduce__()[1]))


# --------------------------------------------------------------------------- seeded ids

_REAL_UUID4 = uuid.uuid4
_ids_lock = threading.Lock()
_ids_rng: random.Random | None = None
# Callers whose uuid4() is not an id the system stores and would only make the seeded stream
# depend on thread timing: the OpenAI SDK draws an idempotency key per POST (not sent to a
# server without an idempotency header), and in mem0's graph mode the graph thread's requests
# interleave with the vector thread's memory ids.
_UNSEEDED_CALLERS = ("openai.", "httpx", "httpcore")


def _seeded_uuid4() -> uuid.UUID:
    caller = sys._getframe(1).f_globals.get("__name__", "")
    if _ids_rng is None or caller.startswith(_UNSEEDED_CALLERS):
        return _REAL_UUID4()
    with _ids_lock:
        bits = _ids_rng.getrandbits(128)
    return uuid.UUID(int=bits, version=4)


def seed_ids(seed: str) -> None:
    """`uuid.uuid4()` and the `random` module draw from a generator seeded by `seed` (call it
    at the start of each build/search with the unit id: a rerun gets the same ids)."""
    global _ids_rng
    with _ids_lock:
        _ids_rng = random.Random(f"ids:{seed}")
    random.seed(f"random:{seed}")
    uuid.uuid4 = _seeded_uuid4  # modules call uuid.uuid4() through the module attribute


# --------------------------------------------------------------------------- no network


def _is_loopback(host: Any) -> bool:
    if host is None:
        return True  # passive getaddrinfo (a server binding): nothing leaves the machine
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).strip("[]").split("%")[0]
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check(host: Any) -> None:
    if not _is_loopback(host):
        # logged too: a system that swallows the OSError (telemetry clients do) still leaves
        # a line in the worker's log, which the systems tier looks for
        logging.getLogger("structmem_worker").warning("network refused by structmem worker: %s", host)
        raise OSError(f"network refused by structmem worker: {host}")


def refuse_network() -> None:
    """Any connection to a host other than loopback raises OSError: a system that phones home
    (telemetry, model downloads, a hard-coded api.openai.com) fails loudly instead of leaking
    data or depending on the network. Unix sockets are allowed. Loopback is also added to
    NO_PROXY, so a proxy in the job's environment does not catch the front's URL."""
    if getattr(socket, "_structmem_refused", False):
        return
    real_gai, real_cc = socket.getaddrinfo, socket.create_connection
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def getaddrinfo(host, *args, **kw):  # type: ignore[no-untyped-def]
        _check(host)
        return real_gai(host, *args, **kw)

    def create_connection(address, *args, **kw):  # type: ignore[no-untyped-def]
        _check(address[0])
        return real_cc(address, *args, **kw)

    def _addr_host(sock: socket.socket, address: Any) -> Any:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
            return address[0]
        return None  # AF_UNIX and friends: local

    def connect(self, address):  # type: ignore[no-untyped-def]
        _check(_addr_host(self, address))
        return real_connect(self, address)

    def connect_ex(self, address):  # type: ignore[no-untyped-def]
        _check(_addr_host(self, address))
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.create_connection = create_connection
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket._structmem_refused = True  # type: ignore[attr-defined]
    loop = "127.0.0.1,localhost,::1"
    for var in ("NO_PROXY", "no_proxy"):
        os.environ[var] = f"{os.environ[var]},{loop}" if os.environ.get(var) else loop


# --------------------------------------------------------------------------- drops


class DropCounter(logging.Handler):
    """Counts log records that mean the system silently dropped memories (a reply it could not
    parse, logged and swallowed). Attach to the system's logger(s); `rules` are
    (logger-name prefix, message substring, where, why). A record counts once (first rule)."""

    def __init__(self, rules: list[tuple[str, str, str, str]]) -> None:
        super().__init__(level=logging.DEBUG)
        self.rules = list(rules)
        self.drops: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken log call is not a drop
            return
        for prefix, needle, where, why in self.rules:
            if record.name.startswith(prefix) and needle in msg:
                self.drops.append({"where": where, "why": why})
                return

    def take(self) -> list[dict[str, str]]:
        """The drops since the last take (and reset)."""
        with self.lock:  # type: ignore[union-attr]
            out, self.drops = self.drops, []
        return out


class PrintWatcher(io.TextIOBase):
    """sys.stdout while a system that prints (not logs) its swallowed failures runs: every line
    goes on to `out` (the worker's log); a line starting with a rule's needle is one drop.
    `rules` are (needle, where, why). Thread-safe: systems print from their own pools."""

    def __init__(self, out: Any, rules: list[tuple[str, str, str]]) -> None:
        self.out = out
        self.rules = list(rules)
        self.buf = ""
        self.drops: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.out.write(s)
        with self._lock:
            self.buf += s
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                for needle, where, why in self.rules:
                    if line.startswith(needle):
                        self.drops.append({"where": where, "why": why})
                        break
        return len(s)

    def flush(self) -> None:
        self.out.flush()

    def take(self) -> list[dict[str, str]]:
        with self._lock:
            out, self.drops = self.drops, []
        return out


def run_forked(fn: Callable[[], Any]) -> Any:
    """`fn()` in a forked child (the worker's imports and patches inherited, nothing a previous
    unit left behind), its JSON-able result returned; its exception re-raised here as a
    RuntimeError with the child's traceback. For systems that keep per-process state between
    conversations (module globals, library caches), so a unit's requests do not depend on the
    units its worker served before. POSIX only (fork)."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: run, write one JSON document, leave without cleanup handlers
        os.close(read_fd)
        try:
            out = {"ok": fn()}
        except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
            out = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        try:
            with os.fdopen(write_fd, "w", encoding="utf-8") as f:
                json.dump(out, f, default=str)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, encoding="utf-8") as f:
        raw = f.read()
    _, status = os.waitpid(pid, 0)
    if not raw:
        raise RuntimeError(f"the unit's child process died (wait status {status}) before it "
                           f"replied: see the worker's log")
    out = json.loads(raw)
    if "error" in out:
        raise RuntimeError(f"{out['error']}\n{out['trace'][-2000:]}")
    return out["ok"]


def locomo_time(value: str | None) -> str | None:
    """An ISO session time as LoCoMo writes it ("1:56 pm on 8 May, 2023"): what the systems'
    own LoCoMo drivers read; a value that is not ISO goes as it is."""
    if not value:
        return None
    try:
        t = _REAL_DATETIME.fromisoformat(value)
    except ValueError:
        return value
    hour = t.hour % 12 or 12
    return f"{hour}:{t.minute:02d} {'am' if t.hour < 12 else 'pm'} on {t.day} {t:%B}, {t.year}"


class SubPhases:
    """Attributes a system's calls to its steps when one client serves them all: while
    `step(name)` is active, every httpx request to the unit's base URL goes to the same URL
    with the phase segment `<phase>.<name>` (`/u/<system>/build.extract/<unit>/v1/...`), so
    the front's requests rows (request_id's phase field) say which step sent each call.
    `install()` patches httpx.Client.send (the OpenAI SDK sends through it; openai 3.x sends
    through httpx2's, patched too where installed), once per worker; outside a step, and for
    other URLs, requests go unchanged."""

    def __init__(self) -> None:
        # one step at a time per worker, seen by every thread (systems send from their pools)
        self._base: str | None = None  # the unit's URL path, /u/<system>/<phase>/<unit>/v1
        self._step: str | None = None

    def install(self) -> None:
        """Route httpx's (and httpx2's) requests through `route` (once per worker process)."""
        found = []
        for name in ("httpx", "httpx2"):  # httpx2: the fork openai 3.x sends through
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            self._patch(module.Client)
            found.append(name)
        if not found:
            raise ImportError("SubPhases needs httpx or httpx2 (the OpenAI SDK's HTTP client)")

    def _patch(self, client_cls: Any) -> None:
        real = client_cls.send
        me = self

        def send(client: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            routed = me.route(request.url.path)
            if routed != request.url.path:
                request.url = request.url.copy_with(path=routed)
            return real(client, request, *args, **kwargs)

        client_cls.send = send

    def unit(self, base_url: str | None) -> None:
        """The unit being served (its base URL from the request), or None."""
        from urllib.parse import urlsplit

        self._base = None if base_url is None else urlsplit(base_url).path.rstrip("/")
        self._step = None

    @contextlib.contextmanager
    def step(self, name: str) -> Any:
        old, self._step = self._step, name
        try:
            yield
        finally:
            self._step = old

    def route(self, path: str) -> str:
        if self._base is None or self._step is None:
            return path
        prefix = self._base
        if not path.startswith(prefix):
            return path
        parts = prefix.split("/")  # ["", "u", system, phase, unit, "v1"]
        if len(parts) < 6 or parts[1] != "u":
            return path
        parts[3] = f"{parts[3].split('.', 1)[0]}.{self._step}"
        return "/".join(parts) + path[len(prefix):]


# --------------------------------------------------------------------------- protocol loop


class _Ring(logging.Handler):
    def __init__(self, n: int) -> None:
        super().__init__(level=logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=n)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.extend(self.format(record).splitlines()[-LOG_TAIL_LINES:])
        except Exception:  # noqa: BLE001, S110 - the tail is a courtesy; the stderr log has it
            pass

    def tail(self) -> str:
        return "\n".join(self.lines)


def package_version(dist: str) -> str:
    """The installed version of the system's distribution ("unknown" when it has no metadata):
    the worker's `ready` reply, recorded in the manifest notes."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


# tiktoken's o200k_base URL: its cache file is named sha1(URL) (systems/lightrag.py writes it)
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


def require_o200k(prepared_by: str) -> None:
    """Refuse to start when TIKTOKEN_CACHE_DIR lacks o200k_base (tiktoken would download it);
    `prepared_by`: the job-side function that writes it, named in the error."""
    import hashlib
    from pathlib import Path

    cache = os.environ.get("TIKTOKEN_CACHE_DIR", "")
    blob = Path(cache) / hashlib.sha1(O200K_URL.encode()).hexdigest()
    if not cache or not blob.is_file():
        raise RuntimeError(f"TIKTOKEN_CACHE_DIR={cache!r} has no o200k_base ({blob.name}): "
                           f"the job's {prepared_by} writes it; tiktoken would download it")


def refuse_pipmaster(lock: str) -> None:
    """pipmaster (LightRAG, MiniRAG) `pip install`s a missing package when a module is
    imported: in a locked environment that is a bug to see, not a download to allow. `lock`:
    the system's lock file, named in the error."""
    import pipmaster

    def refuse(*args: Any, **kw: Any) -> Any:
        raise RuntimeError(f"run-time install refused by structmem worker: {args!r}; add the "
                           f"package to the system's lock (systems/locks/{lock})")

    for name in dir(pipmaster):
        if name.startswith(("install", "ensure", "uninstall")):
            setattr(pipmaster, name, refuse)


def repository_version() -> str:
    """The pinned commit `systems install` exported for a repository-released system (its
    record beside STRUCTMEM_SYSTEM_SRC): the worker's `ready` version; "unknown" without one."""
    src = os.environ.get("STRUCTMEM_SYSTEM_SRC")
    if src:
        state = os.path.join(os.path.dirname(os.path.abspath(src)), "structmem_system.json")
        try:
            with open(state, encoding="utf-8") as f:
                commit = json.load(f).get("commit")
        except (OSError, ValueError):
            commit = None
        if commit:
            return str(commit)[:7]
    return "unknown"


def serve(handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]], system: str,
          version: str) -> None:
    """The protocol loop: one JSON request per stdin line, one JSON reply per line on the REAL
    stdout. fd 1 and sys.stdout are pointed at stderr first, so whatever the system prints (or
    a C library writes) lands in the log, not in the protocol. A handler's exception becomes
    an "error" reply with the log's tail; the loop goes on. "exit" returns."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.INFO)  # handlers filter by level: a DropCounter may see DEBUG records
    ring = _Ring(LOG_TAIL_LINES)
    for h in (err, ring):
        h.setFormatter(fmt)
        root.addHandler(h)
    log = logging.getLogger("structmem.worker")
    log.info("worker %s (%s) started, pid %d", system, version, os.getpid())

    def reply(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg, ensure_ascii=False) + "\n")
        out.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        req: dict[str, Any] = {}
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "exit":
                log.info("exit")
                return
            if op not in handlers:
                raise ValueError(f"unknown op {op!r} (expected one of {sorted(handlers)} or exit)")
            res = handlers[op](req) or {}
            if op == "hello":
                res = {"op": "ready", "system": system, "version": version, **res}
            reply(res)
        except Exception as e:  # noqa: BLE001 - any failure is one error reply
            log.error("%s failed:\n%s", req.get("op"), traceback.format_exc())
            reply({"op": "error", "unit": req.get("unit"), "error": f"{type(e).__name__}: {e}",
                   "log_tail": ring.tail()})
