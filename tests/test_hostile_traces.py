"""Hostile trace files (`python -m engine trace FILE`, engine/traces): malformed lines, wrong encodings, deep nesting,
over-long lines and a file of 10^6 lines. The bad record is named in one sentence and the rest is kept.

What "kept" means, per format (engine/traces/readers.py): in a log or JSONL file every other line; in a verifiers
rollout the steps before the bad one; in a trajectory document (ATIF, mini-swe-agent, SWE-agent) the requests before
the bad step. A trajectory document with a line that is not text is refused whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import main
from engine.traces import readers
from engine.traces.readers import read_trace
from engine.traces.records import TraceFormatError, TraceRequest
from engine.traces.report import analyse_trace

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples" / "traces"
DEEP = b"[" * 100_000 + b"]" * 100_000


def sample_lines(name: str) -> list[bytes]:
    return (SAMPLES / name).read_bytes().splitlines(keepends=True)


def lenient_read(path: Path) -> tuple[list[TraceRequest], list[str]]:
    skipped: list[TraceFormatError] = []
    requests = list(read_trace(path, skipped=skipped))
    return requests, [str(e) for e in skipped]


def with_line(tmp_path: Path, sample: str, line_no: int, replacement: bytes, name: str = "") -> Path:
    """The sample with its line `line_no` (1-based) replaced."""
    lines = sample_lines(sample)
    lines[line_no - 1] = replacement
    path = tmp_path / (name or sample)
    path.write_bytes(b"".join(lines))
    return path


# ---- one bad line in a line format: that line named, every other one kept -----------------------------------------

OPENAI_LINE_4 = sample_lines("openai.jsonl")[3]
BAD_OPENAI_LINES = [
    ("latin-1", OPENAI_LINE_4.replace(b"weather", b"w\xe9ather", 1),
     "openai.jsonl: line 4: not UTF-8 text: byte 0xe9 at byte offset {offset} of the line"),
    ("nul", b'{"request": {"messages": []}, "response": {"a\x00": 1}}\n',
     "openai.jsonl: line 4: a NUL byte at byte offset 45 of the line: it is not text"),
    ("deep", DEEP + b"\n", "openai.jsonl: line 4: nested too deeply to read (over Python's recursion limit)"),
    ("deep-in-a-record", b'{"request": {"messages": ' + DEEP + b'}, "response": {}}\n',
     "openai.jsonl: line 4: nested too deeply to read (over Python's recursion limit)"),
    ("not-json", b"{'request': 1}\n",
     "openai.jsonl: line 4: not valid JSON (Expecting property name enclosed in double quotes, column 2)"),
    ("no-response", b'{"request": {"messages": []}}\n',
     "openai.jsonl: line 4: each line needs a request object and a response object"),
    ("cut-short", OPENAI_LINE_4[: len(OPENAI_LINE_4) // 2] + b"\n",
     "openai.jsonl: line 4: not valid JSON ({column})"),
]


@pytest.mark.parametrize("replacement,expected", [c[1:] for c in BAD_OPENAI_LINES],
                         ids=[c[0] for c in BAD_OPENAI_LINES])
def test_a_bad_jsonl_line_is_named_and_the_other_ten_are_kept(tmp_path, replacement, expected):
    requests, skipped = lenient_read(with_line(tmp_path, "openai.jsonl", 4, replacement))
    assert len(requests) == 10 and "line 4" not in [r.where for r in requests]
    assert len(skipped) == 1
    if "{offset}" in expected:
        expected = expected.format(offset=replacement.index(b"\xe9"))
    if "{column}" in expected:
        assert skipped[0].startswith(expected.partition("{column}")[0])
    else:
        assert skipped == [expected]


def test_without_skipped_the_first_bad_line_is_raised(tmp_path):
    path = with_line(tmp_path, "openai.jsonl", 4, b"{'request': 1}\n")
    with pytest.raises(TraceFormatError) as caught:
        list(read_trace(path))
    assert str(caught.value) == ("openai.jsonl: line 4: not valid JSON (Expecting property name enclosed in double "
                                 "quotes, column 2)")


def test_a_latin_1_byte_in_a_vllm_log_loses_only_that_request(tmp_path):
    line = sample_lines("vllm-0.33.0.log")[2]  # request chatcmpl-2ad1245c92010b38's details (its prompt)
    path = with_line(tmp_path, "vllm-0.33.0.log", 3, line.replace(b"You are", b"Vous \xeates", 1))
    requests, skipped = lenient_read(path)
    assert len(requests) == 10 and "line 3" not in [r.where for r in requests]
    assert skipped == [f"vllm-0.33.0.log: line 3: not UTF-8 text: byte 0xea at byte offset {line.index(b'You are') + 5}"
                       " of the line"]


@pytest.mark.parametrize("cut,expected", [
    (lambda line: line[:-200] + b"\n", "a request-logger record cut short (it does not end with }})"),
    (lambda line: line.replace(b'"rid": ', b'"rid" ', 1), "not valid JSON (Expecting ':' delimiter, column {column})"),
], ids=["cut-short", "broken-inside"])
def test_a_broken_sglang_record_loses_only_that_request(tmp_path, cut, expected):
    line = sample_lines("sglang-0.5.23.log")[10]  # request.finished of noncanonical-tokens-5-1
    assert b'"event": "request.finished"' in line
    path = with_line(tmp_path, "sglang-0.5.23.log", 11, cut(line))
    requests, skipped = lenient_read(path)
    assert len(requests) == 10 and "line 11" not in [r.where for r in requests]
    column = line.index(b'"rid": ') + 7 - len(b"[2026-12-01 09:30:02] ")
    assert skipped == [f"sglang-0.5.23.log: line 11: {expected.format(column=column)}"]


def test_a_verifiers_rollout_keeps_the_steps_before_its_bad_one():
    requests, skipped = lenient_read(SAMPLES / "malformed" / "verifiers.jsonl")
    assert [r.where for r in requests] == ["line 1, trajectory[0]"]
    assert skipped == ["verifiers.jsonl: line 1, trajectory[1]: tokens.prompt_ids is not a list of token ids (got str)"]


def test_a_verifiers_list_keeps_the_other_rollouts_and_the_steps_before_the_bad_one():
    requests, skipped = lenient_read(SAMPLES / "malformed" / "verifiers.json")
    assert [r.where for r in requests] == ["rollout [0], trajectory[0]", "rollout [0], trajectory[1]",
                                           "rollout [1], trajectory[0]", "rollout [1], trajectory[1]",
                                           "rollout [1], trajectory[2]", "rollout [2], trajectory[0]"]
    assert skipped == ["verifiers.json: rollout [2], trajectory[1]: tokens.completion_ids is not a list of token ids "
                       "(got NoneType)"]


def test_a_verifiers_list_whose_first_rollout_outgrows_the_head_is_still_told(tmp_path):
    """The format is told from the first MB: a list whose first rollout is longer is told by its keys."""
    rollouts = json.loads((SAMPLES / "verifiers-results.json").read_text(encoding="utf-8"))
    rollouts[0]["info"] = {"notes": "x" * (readers.HEAD_BYTES + 1000)}
    path = tmp_path / "big.json"
    path.write_text(json.dumps(rollouts, indent=2), encoding="utf-8")
    assert readers.detect_format("big.json", path.read_bytes()[:readers.HEAD_BYTES].decode()) == "verifiers-json"
    assert [r.where for r in read_trace(path)][:2] == ["rollout [0], trajectory[0]", "rollout [0], trajectory[1]"]


def test_a_verifiers_list_read_as_jsonl_says_which_format_reads_it():
    with pytest.raises(TraceFormatError) as caught:
        list(read_trace(SAMPLES / "verifiers-results.json", "verifiers"))
    assert str(caught.value) == ("verifiers-results.json: line 1: a JSON list, not one rollout a line: rollouts saved "
                                 "as one JSON list are read as --format verifiers-json")


def test_an_atif_document_keeps_the_requests_before_its_bad_step():
    requests, skipped = lenient_read(SAMPLES / "malformed" / "atif.json")
    assert [r.where for r in requests] == ["steps[2]"]
    assert skipped == ["atif.json: steps[3]: step_id=7 is not sequential; expected 4"]


# ---- encodings ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encode", [
    lambda text: b"\xef\xbb\xbf" + text.encode("utf-8"),
    lambda text: text.encode("utf-16"),
    lambda text: text.encode("utf-16-be").join([b"\xfe\xff", b""]),
    lambda text: text.encode("utf-32"),
], ids=["utf-8-bom", "utf-16-le-bom", "utf-16-be-bom", "utf-32-bom"])
@pytest.mark.parametrize("sample", ["openai.jsonl", "vllm-0.33.0.log", "atif.json"])
def test_a_byte_order_mark_says_the_encoding_and_every_request_is_kept(tmp_path, sample, encode):
    path = tmp_path / sample
    path.write_bytes(encode((SAMPLES / sample).read_text(encoding="utf-8")))
    requests, skipped = lenient_read(path)
    assert skipped == []
    assert [r.prompt_ids for r in requests] == [r.prompt_ids for r in read_trace(SAMPLES / sample)]


def test_utf_16_without_a_byte_order_mark_is_refused_in_one_sentence(tmp_path):
    path = tmp_path / "openai.jsonl"
    path.write_bytes((SAMPLES / "openai.jsonl").read_text(encoding="utf-8").encode("utf-16-le"))
    with pytest.raises(TraceFormatError) as caught:
        list(read_trace(path, skipped=[]))
    assert str(caught.value) == ("openai.jsonl: line 1 holds NUL bytes: it is a binary file, or UTF-16 without a "
                                 "byte-order mark (save it as UTF-8)")


def test_a_document_with_a_latin_1_byte_is_refused_whole(tmp_path):
    lines = sample_lines("atif.json")
    lines[9] = lines[9].replace(b"e", b"\xe9", 1)
    path = tmp_path / "atif.json"
    path.write_bytes(b"".join(lines))
    with pytest.raises(TraceFormatError) as caught:
        list(read_trace(path, skipped=[]))
    assert str(caught.value).startswith("atif.json: line 10: not UTF-8 text: byte 0xe9 at byte offset ")


def test_a_deeply_nested_document_is_one_sentence(tmp_path):
    path = tmp_path / "atif.json"
    path.write_bytes(b'{\n  "schema_version": "ATIF-v1.6",\n  "steps": ' + DEEP + b"\n}\n")
    with pytest.raises(TraceFormatError) as caught:
        list(read_trace(path, skipped=[]))
    assert str(caught.value) == "atif.json: line 1: the trajectory is nested too deeply to read (over Python's " \
                                "recursion limit)"


def test_a_deeply_nested_first_line_is_not_a_format(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(DEEP + b"\n")
    with pytest.raises(TraceFormatError) as caught:
        list(read_trace(path, skipped=[]))
    assert str(caught.value).startswith("deep.jsonl: line 1 is not any trace format read here (vllm-log, ")


def test_an_over_long_line_is_skipped_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 65_536)
    lines = sample_lines("openai.jsonl")
    assert max(map(len, lines)) < 65_536
    lines.insert(5, b'{"request": {"messages": [{"role": "user", "content": "' + b"x" * 1_000_000 + b'"}]}}\n')
    path = tmp_path / "openai.jsonl"
    path.write_bytes(b"".join(lines))
    requests, skipped = lenient_read(path)
    assert len(requests) == 11 and "line 6" not in [r.where for r in requests]
    assert skipped == ["openai.jsonl: line 6: the line is longer than the 65,536 bytes a trace line may hold; it was "
                       "not read"]


# ---- the CLI: the rest reported, the bad record one sentence, exit 2 ------------------------------------------------

def test_the_cli_reports_the_rest_and_exits_2_with_one_sentence(tmp_path, capsys):
    path = with_line(tmp_path, "openai.jsonl", 4, DEEP + b"\n")
    code = main(["trace", str(path), "--json", "-"])
    out, err = capsys.readouterr()
    assert code == 2
    report = json.loads(out)
    assert sum(len(s["requests"]) for s in report["sessions"]) == 10
    assert report["skipped"] == ["openai.jsonl: line 4: nested too deeply to read (over Python's recursion limit)"]
    assert err == ("error: openai.jsonl: line 4: nested too deeply to read (over Python's recursion limit) (that "
                   "record was skipped, the rest of the file was read)\n")


def test_the_cli_names_several_bad_records_in_one_sentence(tmp_path, capsys):
    lines = sample_lines("openai.jsonl")
    for line_no in (2, 5, 9):
        lines[line_no - 1] = b"\xff\n"
    path = tmp_path / "openai.jsonl"
    path.write_bytes(b"".join(lines))
    code = main(["trace", str(path)])
    out, err = capsys.readouterr()
    assert code == 2
    assert out.startswith("openai.jsonl: openai-jsonl, ") and ", 8 requests, 3 bad record(s) skipped\n" in out
    assert err == ("error: openai.jsonl: line 2: not UTF-8 text: byte 0xff at byte offset 0 of the line (3 bad records "
                   "were skipped: this one and line 5, line 9; the rest of the file was read)\n")


def test_a_file_of_only_bad_records_is_refused(tmp_path, capsys):
    path = tmp_path / "openai.jsonl"
    path.write_bytes(sample_lines("openai.jsonl")[0][:200] + b"\n" + b"\x00\n")
    assert main(["trace", str(path), "--format", "openai-jsonl"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("error: openai.jsonl: line 1: not valid JSON (Invalid control character at, column 201) (2 bad "
                   "records were skipped: this one and line 2; no other record is a complete request)\n")


def test_a_subprocess_sees_no_traceback(tmp_path):
    body = sample_lines("vllm-0.33.0.log")[1]  # request 2ad1245c92010b38's JSON body: the request is kept without it
    path = with_line(tmp_path, "vllm-0.33.0.log", 2, body[: body.index(b"JSON body: ") + 11] + DEEP + b"\n")
    done = subprocess.run([sys.executable, "-m", "engine", "trace", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout.startswith("vllm-0.33.0.log: vllm-log, 5 session(s), 11 requests")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr == ("error: vllm-0.33.0.log: line 2: the JSON body of request 2ad1245c92010b38 is nested too "
                           "deeply to read (over Python's recursion limit) (that record was skipped, the rest of the "
                           "file was read)\n")


def test_analysis_of_a_file_with_a_bad_line_equals_the_analysis_without_it(tmp_path):
    """Kept means kept whole: the figures of the other requests are those of the file without the bad line."""
    lines = sample_lines("openai.jsonl")
    without = tmp_path / "without.jsonl"
    without.write_bytes(b"".join(lines[:3] + lines[4:]))
    bad = with_line(tmp_path, "openai.jsonl", 4, b"\x00\n", name="bad.jsonl")
    with_bad = analyse_trace(bad, skip_bad_records=True)
    clean = analyse_trace(without)
    assert [[s.row.prompt_tokens for s in t.steps] for t in with_bad.sessions] == \
        [[s.row.prompt_tokens for s in t.steps] for t in clean.sessions]
    assert [str(e) for e in with_bad.skipped] == ["bad.jsonl: line 4: a NUL byte at byte offset 0 of the line: it is "
                                                  "not text"]


# ---- 10^6 lines: streamed in bounded memory --------------------------------------------------------------------------

LINES = 1_000_000
BAD_EVERY = 100_000
# Reads the file request by request and reports its peak resident memory over what the process held before reading.
MEASURE = """
import sys
from engine.traces.readers import read_trace

def peak_kb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

before = peak_kb()
skipped = []
count = sum(1 for _ in read_trace(sys.argv[1], skipped=skipped))
print(count, len(skipped), peak_kb() - before, skipped[0])
"""


@pytest.mark.slow
def test_a_million_lines_stream_in_bounded_memory(tmp_path):
    # One session's requests, every 100,000th line malformed; about 90 MB.
    template = ('{"session_id": "s%d", "request": {"messages": [{"role": "user", "content": "hi %d"}]}, "response": '
                '{"id": "r%d", "prompt_token_ids": [1, 2, 3, %d], "choices": [{"message": {"role": "assistant", '
                '"content": "ok"}, "token_ids": [7, 8]}]}}\n')
    path = tmp_path / "big.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for start in range(0, LINES, 10_000):
            out.write("".join("{\n" if (i + 1) % BAD_EVERY == 0 else template % (i % 50, i, i, i)
                              for i in range(start, start + 10_000)))
    assert path.stat().st_size > 80 << 20
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    count, skipped, grew_kb, first = done.stdout.split(" ", 3)
    assert (int(count), int(skipped)) == (LINES - LINES // BAD_EVERY, LINES // BAD_EVERY)
    assert first.strip() == ("big.jsonl: line 100000: not valid JSON (Expecting property name enclosed in double "
                             "quotes, column 1)")
    # A read that kept the file (90 MB of text, far more as objects) would grow by hundreds of MB.
    assert int(grew_kb) < 20 * 1024, f"peak RSS grew by {int(grew_kb) // 1024} MB while reading"
