"""Carry wheels to the GPU machine in a third of their size: a wheel is a zip that compresses each file alone (lm-eval's
thousands of task YAMLs barely shrink), so prepare.sh stores the wheels' unpacked files in one solid xz archive and
call1.sh zips each wheel back before pip installs it (a wheel's RECORD hashes its files, not the zip).
  python3 wheels_xz.py pack WHEEL_DIR ARCHIVE.tar.xz      (here)
  python3 wheels_xz.py unpack ARCHIVE.tar.xz WHEEL_DIR    (there: WHEEL_DIR/<name>.whl again)
"""
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path


def pack(wheel_dir: Path, archive: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive, "w:xz", preset=9) as tar:
        for wheel in sorted(wheel_dir.glob("*.whl")):
            with zipfile.ZipFile(wheel) as source:
                names = source.namelist()
                source.extractall(Path(tmp) / wheel.stem)
            (Path(tmp) / wheel.stem / ".order").write_text("\n".join(names))  # RECORD stays the zip's last entry
            tar.add(Path(tmp) / wheel.stem, arcname=wheel.stem)


def unpack(archive: Path, wheel_dir: Path) -> None:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(tmp, filter="data")
        for folder in sorted(Path(tmp).iterdir()):
            names = (folder / ".order").read_text().split("\n")
            with zipfile.ZipFile(wheel_dir / f"{folder.name}.whl", "w", zipfile.ZIP_DEFLATED) as wheel:
                for name in names:
                    if not name.endswith("/"):
                        wheel.write(folder / name, name)


if __name__ == "__main__":
    action, source, target = sys.argv[1:4]
    {"pack": pack, "unpack": unpack}[action](Path(source), Path(target))
