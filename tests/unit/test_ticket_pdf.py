"""The BoxOffice ticket PDF demo job: deterministic, atomic, QR drawn from segno's matrix."""

from __future__ import annotations

import random
import re
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

segno = pytest.importorskip("segno")
pytest.importorskip("fpdf")

from fairq.demo.ticket_pdf import (  # noqa: E402
    QR_ERROR,
    qr_payload,
    render_ticket,
    render_ticket_bytes,
    ticket_job,
)

ORDER: dict[str, Any] = {
    "type": "GenerateTicketPdf",
    "order": "o-7731",
    "event": "ev-88 Coliseu do Porto — Noite de Fado (matinée)",
    "seats": ["B-12-7", "B-12-8"],
    "fan": "João Araújo",
    "issued_at": "2025-06-02T10:00:07+00:00",
}


# --------------------------------------------------------------------------- PDF helpers


def _content_streams(pdf: bytes) -> list[bytes]:
    """Every stream of the file, inflated when fpdf2 compressed it."""
    out = []
    for m in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", pdf, flags=re.S):
        raw = m.group(1)
        try:
            out.append(zlib.decompress(raw))
        except zlib.error:
            out.append(raw)
    return out


def _unescape(s: bytes) -> bytes:
    return re.sub(
        rb"\\(.)", lambda m: {b"n": b"\n", b"r": b"\r", b"t": b"\t"}.get(m[1], m[1]), s, flags=re.S
    )


def _pdf_text(pdf: bytes) -> str:
    """The strings shown with ``Tj`` (fpdf2 core fonts: one literal string per cell)."""
    parts = []
    for stream in _content_streams(pdf):
        for m in re.finditer(rb"\(((?:\\.|[^\\)])*)\)\s*Tj", stream, flags=re.S):
            parts.append(_unescape(m.group(1)).decode("cp1252"))
    return "\n".join(parts)


_NUM = rb"(-?\d+(?:\.\d+)?)"
_RECT_FILL = re.compile(_NUM + rb" " + _NUM + rb" " + _NUM + rb" " + _NUM + rb" re f\b")


def _qr_matrix_from_pdf(pdf: bytes) -> list[list[int]]:
    """Rebuild the module matrix from the filled rectangles in the page content."""
    rects = []
    for stream in _content_streams(pdf):
        for m in _RECT_FILL.finditer(stream):
            x, y, w, h = (float(v) for v in m.groups())
            top = max(y, y + h)  # PDF y grows upwards; fpdf2 emits a negative height
            rects.append((x, top, w, abs(h)))
    assert rects, "no filled rectangles in the page"
    module = min(h for *_, h in rects)
    assert all(abs(h - module) < 0.05 for *_, h in rects), "every run is one module high"
    left = min(x for x, *_ in rects)
    upper = max(t for _, t, *_ in rects)
    cells = set()
    for x, top, w, _ in rects:
        row = round((upper - top) / module)
        col = round((x - left) / module)
        for k in range(round(w / module)):
            cells.add((row, col + k))
    size = max(max(r, c) for r, c in cells) + 1
    return [[int((r, c) in cells) for c in range(size)] for r in range(size)]


# --------------------------------------------------------------------------- tests


def test_writes_order_named_pdf_creating_the_directory(tmp_path: Path) -> None:
    target = tmp_path / "tickets" / "2025"
    path = render_ticket(ORDER, target)
    assert path == target / "o-7731.pdf"
    assert path.is_file()
    data = path.read_bytes()
    assert data.startswith(b"%PDF")
    assert data.rstrip().endswith(b"%%EOF")
    assert [p.name for p in target.iterdir()] == ["o-7731.pdf"], "no temp file left behind"


def test_second_render_is_byte_identical_and_skips_the_write(tmp_path: Path) -> None:
    path = render_ticket(ORDER, tmp_path)
    first = path.read_bytes()
    inode = path.stat().st_ino
    assert render_ticket(dict(ORDER), str(tmp_path)) == path
    assert path.read_bytes() == first
    assert path.stat().st_ino == inode, "identical bytes: file left alone, not replaced"
    # A fresh render elsewhere (another worker) yields the same bytes too.
    assert render_ticket(ORDER, tmp_path / "other").read_bytes() == first
    assert render_ticket_bytes(ORDER) == first


def test_bytes_do_not_depend_on_clock_or_local_timezone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    first = render_ticket_bytes(ORDER)
    assert b"/CreationDate (D:20250602100007Z)" in first  # from issued_at, not "now"
    if hasattr(time, "tzset"):
        monkeypatch.setenv("TZ", "Pacific/Auckland")
        time.tzset()
        try:
            assert render_ticket_bytes(ORDER) == first
        finally:
            monkeypatch.undo()
            time.tzset()


@pytest.mark.parametrize(
    "issued_at",
    [1748858407.0, 1748858407, "2025-06-02T10:00:07Z", "2025-06-02T11:00:07+01:00"],
)
def test_issued_at_forms_for_the_same_instant_render_the_same(issued_at: Any) -> None:
    assert render_ticket_bytes({**ORDER, "issued_at": issued_at}) == render_ticket_bytes(ORDER)


def test_replaces_a_stale_or_truncated_file(tmp_path: Path) -> None:
    stale = tmp_path / "o-7731.pdf"
    stale.write_bytes(b"%PDF-1.3 truncated by a crash")
    path = render_ticket(ORDER, tmp_path)
    assert path == stale
    assert path.read_bytes() == render_ticket_bytes(ORDER)
    assert [p.name for p in tmp_path.iterdir()] == ["o-7731.pdf"]


@pytest.mark.parametrize(
    "order_id",
    ["", "../etc/passwd", "a/b", "o 7731", "o-7731\n", "x" * 101, "ó-1", None, 7731],
)
def test_bad_order_id_raises_value_error(tmp_path: Path, order_id: Any) -> None:
    with pytest.raises(ValueError, match="order id"):
        render_ticket({**ORDER, "order": order_id}, tmp_path / "t")
    assert not (tmp_path / "t").exists(), "nothing written for a rejected job"


def test_longest_order_id_is_accepted(tmp_path: Path) -> None:
    order_id = "A.b_9:-" * 14 + "xx"
    assert len(order_id) == 100
    assert render_ticket({**ORDER, "order": order_id}, tmp_path).name == f"{order_id}.pdf"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("seats", []),
        ("seats", "B-12-7"),
        ("seats", ["B-12-7,B-12-8"]),
        ("seats", [""]),
        ("seats", [7]),
        ("event", ""),
        ("fan", None),
        ("issued_at", "yesterday"),
        ("issued_at", True),
        ("issued_at", None),
    ],
)
def test_bad_job_body_raises_value_error(key: str, value: Any) -> None:
    with pytest.raises(ValueError):
        render_ticket_bytes({**ORDER, key: value})


def test_qr_payload_is_compact() -> None:
    assert qr_payload(ORDER) == "boxoffice:ticket:o-7731:B-12-7,B-12-8"


def test_rendered_qr_matrix_equals_segno_matrix_for_the_payload() -> None:
    expected = segno.make(qr_payload(ORDER), error=QR_ERROR, micro=False)
    rendered = _qr_matrix_from_pdf(render_ticket_bytes(ORDER))
    assert rendered == [[v & 1 for v in row] for row in expected.matrix]
    # Another order draws another code.
    other = _qr_matrix_from_pdf(render_ticket_bytes({**ORDER, "order": "o-7732"}))
    assert other != rendered


def test_pdf_text_shows_order_event_seats_and_fan() -> None:
    text = _pdf_text(render_ticket_bytes(ORDER))
    assert "BoxOffice" in text
    assert "o-7731" in text
    assert "ev-88 Coliseu do Porto — Noite de Fado (matinée)" in text
    assert "B-12-7, B-12-8" in text
    assert "João Araújo" in text


def test_text_outside_cp1252_is_approximated_not_fatal() -> None:
    text = _pdf_text(render_ticket_bytes({**ORDER, "fan": "Łukasz Żółć 李"}))
    assert "Fan: Lukasz Zólc ?" in text


def test_missing_extra_raises_runtime_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "segno", None)  # makes `import segno` fail
    with pytest.raises(RuntimeError, match=r"pip install 'fairq\[demo\]'"):
        render_ticket_bytes(ORDER)


def test_ticket_job_is_deterministic_and_renderable(tmp_path: Path) -> None:
    job = ticket_job(31, random.Random(42))
    assert job == ticket_job(31, random.Random(42))
    assert ticket_job(31) == ticket_job(31, random.Random(31))  # default rng: seeded by i
    assert job["type"] == "GenerateTicketPdf"
    assert job["order"] == "o-7031"
    assert job["event"].startswith("ev-88 ")
    assert 1 <= len(job["seats"]) <= 4
    assert isinstance(job["fan"], str) and job["fan"]
    assert isinstance(job["issued_at"], float)
    assert render_ticket(job, tmp_path).name == "o-7031.pdf"


def test_ticket_jobs_never_share_a_seat() -> None:
    # 6 sectors x 30 rows x 36 seats, 4 per order: the first 1620 orders never overlap.
    seats = [seat for i in range(1620) for seat in ticket_job(i)["seats"]]
    assert len(seats) == len(set(seats))
