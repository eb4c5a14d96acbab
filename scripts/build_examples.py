"""Build the examples' model repository (idempotent): ``build(models, out)``.

Each ``examples/<name>/`` holds a model's own files (model.yaml, its Python); what it reuses from a demo
model (the ONNX file, saved state) is not committed there but named in ``SOURCES`` and copied from the
demo repository ``models`` (built first by scripts/fetch_models.py, which calls this).  The result is
``OUT/<name>/1/``: a model repository of its own (default ``build/examples``), served apart from the
demo repository because loading these models runs their code (README: ``AIENG_ALLOW_MODEL_CODE=1
./scripts/serve.sh --models-dir build/examples``).  A file is rewritten only when its content differs.

    python scripts/build_examples.py [--models models] [--out build/examples]
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# example -> (the demo version it builds on, the files taken from there)
SOURCES = {"penguins": ("tabular/1", ("model.onnx", "preprocess.json", "labels.json", "golden.json"))}


def _copy(src: Path, dst: Path) -> None:
    if not dst.is_file() or dst.read_bytes() != src.read_bytes():
        shutil.copyfile(src, dst)


def build(models: Path, out: Path) -> list[Path]:
    """Every example's version directory under ``out``; ``FileNotFoundError`` naming a missing demo file."""
    built = []
    for name, (demo, files) in SOURCES.items():
        dest = out / name / "1"
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted((EXAMPLES / name).iterdir()):
            if f.is_file() and f.suffix in (".py", ".yaml", ".json", ".txt"):
                _copy(f, dest / f.name)
        for f in files:
            src = models / demo / f
            if not src.is_file():
                raise FileNotFoundError(f"{src} is missing (run scripts/fetch_models.py first)")
            _copy(src, dest / f)
        built.append(dest)
    return built


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="models", help="the demo repository (default: models)")
    ap.add_argument("--out", default="build/examples",
                    help="the examples' repository (default: build/examples)")
    args = ap.parse_args(argv)
    try:
        for path in build(Path(args.models), Path(args.out)):
            print(f"example: {path}")
    except FileNotFoundError as exc:
        print(f"build_examples: ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
