"""tiktoken-based tokenizers: GPT-OSS (o200k_harmony) and Kimi K2.x (`tiktoken.model`, user-supplied).

Both implement engine.tokenize.Tokenizer. Strings are encoded whole with every special token allowed, so a
special token written in the text is always its single id.

Character offsets. tiktoken works on UTF-8 bytes, and a token may hold only part of a character (a CJK
character or an emoji split over two or three tokens). Rule used here: a character belongs to the token that
holds its FIRST byte. A token's span is therefore the characters whose first byte lies inside it; spans never
overlap and their concatenation is the whole text. A token that holds only the trailing bytes of a character
gets an empty span (start == end) placed just after that character.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import tiktoken

from engine.errors import AssetError, is_panic
from engine.types import Tokens

KIMI_SPECIAL_TOKENS_JSON = Path(__file__).resolve().parent.parent / "model_assets" / "kimi-k2.6" / "special_tokens.json"


class TiktokenTokenizer:
    """A `tiktoken.Encoding` behind the project's Tokenizer protocol."""

    def __init__(self, encoding: tiktoken.Encoding, name: str, *, max_same_class_run: int | None = None) -> None:
        self._enc = encoding
        self.name = name
        # Kimi's tokenization_kimi.py cuts runs of whitespace / non-whitespace longer than this before encoding.
        self._max_same_class_run = max_same_class_run
        self._special = {text: encoding.encode_single_token(text) for text in encoding.special_tokens_set}
        self._special_ids = frozenset(self._special.values())

    @property
    def backend(self) -> tiktoken.Encoding:
        return self._enc

    def encode(self, text: str) -> Tokens:
        ids: list[int] = []
        try:
            for piece in self._pieces(text):
                ids.extend(self._enc.encode(piece, allowed_special="all"))
        except BaseException as err:
            if not is_panic(err):
                raise
            raise AssetError(f"{self.name} cannot encode this text: tiktoken stopped with \"{err}\"") from None
        return Tokens(ids=tuple(ids), offsets=self._offsets(text, ids), text=text)

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return self._enc.decode(list(ids))

    def token_text(self, token_id: int) -> str:
        return self._enc.decode_single_token_bytes(token_id).decode("utf-8", errors="replace")

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def token_id(self, text: str) -> int | None:
        return self._special.get(text)

    def _pieces(self, text: str) -> Iterator[str]:
        if self._max_same_class_run is None:
            yield text
            return
        yield from split_long_runs(text, self._max_same_class_run)

    def _offsets(self, text: str, ids: list[int]) -> tuple[tuple[int, int], ...]:
        data = _utf8_like_tiktoken(text)
        # chars_before[b]: how many characters start before byte b (continuation bytes start no character).
        chars_before = [0] * (len(data) + 1)
        count = 0
        for index, byte in enumerate(data):
            chars_before[index] = count
            if byte & 0xC0 != 0x80:
                count += 1
        chars_before[len(data)] = count
        offsets: list[tuple[int, int]] = []
        position = 0
        for token_id in ids:
            end = position + len(self._enc.decode_single_token_bytes(token_id))
            offsets.append((chars_before[position], chars_before[end]))
            position = end
        if position != len(data):
            raise AssertionError(f"{self.name}: token bytes cover {position} of {len(data)} bytes")
        return tuple(offsets)


def split_long_runs(text: str, max_run: int) -> Iterator[str]:
    """Cut `text` so that no piece holds more than `max_run` consecutive whitespace or non-whitespace characters.

    Same cut points as `_split_whitespaces_or_nonwhitespaces` in Kimi's tokenization_kimi.py, which protects
    tiktoken from very long runs; Kimi's real tokenizer encodes each piece separately.
    """
    if not text:
        yield text
        return
    run_length = 0
    run_is_space = text[0].isspace()
    piece_start = 0
    for index, char in enumerate(text):
        is_space = char.isspace()
        if is_space != run_is_space:
            run_length = 1
            run_is_space = is_space
            continue
        run_length += 1
        if run_length > max_run:
            yield text[piece_start:index]
            piece_start = index
            run_length = 1
    yield text[piece_start:]


def _utf8_like_tiktoken(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # tiktoken replaces lone surrogates with U+FFFD (one character each), so character counts still match.
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


# ---- GPT-OSS: o200k_harmony -------------------------------------------------------------------------------


def load_o200k_harmony() -> TiktokenTokenizer:
    """o200k_harmony exactly as tiktoken defines it, with the ranks rebuilt offline from quicktok-v1."""
    from tiktoken_ext import openai_public

    from engine.render.harmony_encoding import O200K_BASE_SHA256, o200k_base_path

    ranks_path = o200k_base_path()

    def load_local_ranks(blobpath: str, expected_hash: str | None = None) -> dict[bytes, int]:
        # tiktoken asks for its o200k_base URL with this hash; serve the verified local copy of that very file.
        if expected_hash != O200K_BASE_SHA256:
            raise AssetError(f"tiktoken asked for {blobpath} with sha256 {expected_hash}; only o200k_base is local.")
        return tiktoken.load.load_tiktoken_bpe(str(ranks_path), expected_hash)

    # The special tokens and split pattern live inside tiktoken's o200k_harmony(); calling it with the rank
    # loader swapped for the local file keeps them tiktoken's own instead of a copy that could drift.
    original_loader = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = load_local_ranks
    try:
        constructor = openai_public.o200k_harmony()
    finally:
        openai_public.load_tiktoken_bpe = original_loader
    encoding = tiktoken.Encoding(**constructor)
    return TiktokenTokenizer(encoding, name=f"gpt-oss o200k_harmony (tiktoken {tiktoken.__version__})")


# ---- Kimi K2.x: tiktoken.model + tokenizer_config.json special tokens ---------------------------------------


def load_kimi(tiktoken_model_path: Path, *, expected_sha256: str | None = None) -> TiktokenTokenizer:
    """Kimi K2.x's tokenizer from a user-supplied `tiktoken.model` (Hub: moonshotai/Kimi-K2.6).

    Split pattern, special-token ids and the long-run cutting are those of the Hub's tokenization_kimi.py and
    tokenizer_config.json (see model_assets/kimi-k2.6/special_tokens.json). Raises AssetError with one sentence
    naming the file, what is wrong and the line, for a missing, mismatching or malformed file.
    """
    path = Path(tiktoken_model_path)
    table = _kimi_table()
    try:
        contents = path.read_bytes()
    except OSError as err:
        raise AssetError(f"Kimi tokenizer file {path} cannot be read ({err.strerror or err}).") from err
    if expected_sha256 is not None:
        actual = hashlib.sha256(contents).hexdigest()
        if actual != expected_sha256:
            raise AssetError(f"Kimi tokenizer file {path.name} has sha256 {actual}, expected {expected_sha256}.")
    ranks = parse_tiktoken_ranks(contents, path.name)
    base_count = int(table["base_rank_count"])
    if len(ranks) != base_count:
        raise AssetError(
            f"Kimi tokenizer file {path.name} has {len(ranks)} ranks, expected {base_count}: "
            "this is not Kimi K2's tiktoken.model."
        )
    check_single_bytes(ranks, path.name)
    named = {int(token_id): text for token_id, text in table["special_tokens"].items()}
    special_count = int(table["special_token_slots"])
    # tokenization_kimi.py names every slot after the base ranks; slots absent from the table are reserved.
    special_tokens = {
        named.get(token_id, f"<|reserved_token_{token_id}|>"): token_id
        for token_id in range(base_count, base_count + special_count)
    }
    encoding = tiktoken.Encoding(
        name=path.name,
        pat_str=table["pat_str"],
        mergeable_ranks=ranks,
        special_tokens=special_tokens,
    )
    return TiktokenTokenizer(
        encoding,
        name=f"kimi-k2.6 {path.name} (tiktoken {tiktoken.__version__})",
        max_same_class_run=int(table["max_same_class_run"]),
    )


def parse_tiktoken_ranks(contents: bytes, file_name: str) -> dict[bytes, int]:
    """Parse `base64(token) rank` lines, checking what tiktoken's own loader does not: ranks 0..n-1, each once."""
    ranks: dict[bytes, int] = {}
    seen_ranks: set[int] = set()
    for line_number, line in enumerate(contents.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise AssetError(f"{file_name} line {line_number}: expected '<base64 token> <rank>', got {_show(line)}.")
        encoded, rank_text = fields
        try:
            token = base64.b64decode(encoded, validate=True)
        except binascii.Error as err:
            problem = f"token {_show(encoded)} is not valid base64 ({err})"
            raise AssetError(f"{file_name} line {line_number}: {problem}.") from err
        if not rank_text.isdigit():
            raise AssetError(f"{file_name} line {line_number}: rank {_show(rank_text)} is not a non-negative integer.")
        rank = int(rank_text)
        if token in ranks:
            raise AssetError(f"{file_name} line {line_number}: token {_show(encoded)} appears a second time.")
        if rank in seen_ranks:
            raise AssetError(f"{file_name} line {line_number}: rank {rank} appears a second time.")
        ranks[token] = rank
        seen_ranks.add(rank)
    if not ranks:
        raise AssetError(f"{file_name} holds no ranks: it is empty or not a tiktoken ranks file.")
    if max(seen_ranks) != len(ranks) - 1:
        missing = min(set(range(len(ranks))) - seen_ranks)
        raise AssetError(f"{file_name}: ranks are not contiguous, rank {missing} is missing.")
    return ranks


def check_single_bytes(ranks: dict[bytes, int], file_name: str) -> None:
    """tiktoken's BPE starts from single bytes: without one, encoding any text holding it panics in Rust."""
    lacking = [byte for byte in range(256) if bytes([byte]) not in ranks]
    if lacking:
        more = f" and {len(lacking) - 1} other single bytes" if len(lacking) > 1 else ""
        raise AssetError(f"{file_name}: the rank table lacks the single byte {_byte(lacking[0])}{more}; a tiktoken "
                         "table needs all 256, or text holding them cannot be encoded.")


def _byte(value: int) -> str:
    char = chr(value)
    return f"0x{value:02x} ({char!r})" if char.isprintable() and value < 0x80 else f"0x{value:02x}"


def _show(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _kimi_table() -> Mapping:
    return json.loads(KIMI_SPECIAL_TOKENS_JSON.read_text(encoding="utf-8"))
