"""In-tree PEP 517 build backend for the anchorkv Python package.

It has no build requirements, so ``pip install .`` works offline: it runs
CMake on this source tree (the same project the README's commands build),
builds only the Python extension, and packs a wheel with the standard
library. Needs cmake, a C++20 compiler and the Debian packages listed in
scripts/deps.sh.
"""

import base64
import hashlib
import os
import pathlib
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

NAME = "anchorkv"
VERSION = "0.1.0"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def _metadata() -> str:
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {VERSION}\n"
        "Summary: AnchorKV anchor-residual KV-cache compression (C++ core, numpy API)\n"
        "Requires-Python: >=3.9\n"
        "Requires-Dist: numpy\n"
    )


def _tag() -> str:
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{py}-{py}-{plat}"


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = pathlib.Path(metadata_directory) / f"{NAME}-{VERSION}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(_metadata())
    return dist_info.name


def _build_extension() -> pathlib.Path:
    build = ROOT / "build-wheel"
    jobs = os.environ.get("ANCHORKV_JOBS", "2")
    subprocess.check_call([
        "cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
        "-DANCHORKV_BUILD_TESTS=OFF", "-DANCHORKV_BUILD_BENCH=OFF", "-DANCHORKV_BUILD_TOOLS=OFF",
        "-DANCHORKV_BUILD_PYTHON=ON", f"-DPython_EXECUTABLE={sys.executable}",
    ], stdout=sys.stderr)
    subprocess.check_call(["cmake", "--build", str(build), "--target", "anchorkv_python", "-j", jobs],
                          stdout=sys.stderr)
    return build / "python" / NAME


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    pkg = _build_extension()
    ext = [p for p in pkg.iterdir() if p.name.startswith("_core") and p.suffix == ".so"]
    if len(ext) != 1:
        raise RuntimeError(f"anchorkv build backend: expected one _core extension in {pkg}, found {ext}")
    files = {
        f"{NAME}/__init__.py": (ROOT / "python" / NAME / "__init__.py").read_bytes(),
        f"{NAME}/{ext[0].name}": ext[0].read_bytes(),
    }
    dist_info = f"{NAME}-{VERSION}.dist-info"
    files[f"{dist_info}/METADATA"] = _metadata().encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: anchorkv_backend\nRoot-Is-Purelib: false\n"
        f"Tag: {_tag()}\n").encode()
    record = [_record_line(p, d) for p, d in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel_name = f"{NAME}-{VERSION}-{_tag()}.whl"
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / wheel_name, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    skip = {".git", "__pycache__"}
    with tarfile.open(pathlib.Path(sdist_directory) / name, "w:gz") as tf:
        for path in sorted(ROOT.rglob("*")):
            rel = path.relative_to(ROOT)
            if rel.parts[0].startswith("build") or skip & set(rel.parts) or path.is_dir():
                continue
            tf.add(path, arcname=f"{base}/{rel}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        import io
        tf.addfile(info, io.BytesIO(data))
    return name
