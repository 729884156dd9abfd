"""The BoxOffice demo job: render a ticket PDF with a QR code.

Every ticket sold by BoxOffice needs a PDF with a QR code, and rendering it costs
CPU, so a web request does not do it: it sends a ``GenerateTicketPdf`` job and a
worker calls :func:`render_ticket`. The output name is ``<directory>/<order>.pdf``
and the bytes depend only on the job body (the PDF creation date comes from
``issued_at``, the QR code is drawn as vector rectangles), so running the same job
twice — after a crash, a lease expiry or a redelivery — writes the same file: the
job is idempotent. The file is replaced atomically, so a reader never sees half a PDF.

Needs the optional extra: ``pip install 'fairq[demo]'`` (segno and fpdf2).

    python -m fairq.demo.ticket_pdf 20 tickets/   # render 20 sample tickets, print timings
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import re
import sys
import tempfile
import time
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fpdf import FPDF

__all__ = [
    "ORDER_ID_RE",
    "QR_ERROR",
    "qr_payload",
    "render_ticket",
    "render_ticket_bytes",
    "ticket_job",
]

_MISSING_EXTRA = "the demo needs: pip install 'fairq[demo]'"

ORDER_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
"""An order id; it becomes a file name, so nothing that could leave the directory."""

QR_ERROR = "m"
"""QR error-correction level (segno may boost it when the data fits anyway)."""

_MAX_SEATS = 100
_MAX_SEAT_LEN = 40
_MAX_TEXT_LEN = 200

# Layout, in millimetres, on an A6 portrait page (105 x 148).
_PAGE_W, _PAGE_H = 105.0, 148.0
_MARGIN = 8.0
_QR_BOX = 66.0  # side of the QR symbol including its 4-module quiet zone
_QR_TOP = 60.0
_QR_QUIET = 4


# --------------------------------------------------------------------------- validation


def _order_id(order: Mapping[str, Any]) -> str:
    value = order.get("order")
    if not isinstance(value, str) or ORDER_ID_RE.fullmatch(value) is None:
        raise ValueError(f"order id must match {ORDER_ID_RE.pattern}, got {value!r}")
    return value


def _text(order: Mapping[str, Any], key: str) -> str:
    value = order.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key!r} must be a non-empty string, got {value!r}")
    if len(value) > _MAX_TEXT_LEN or any(unicodedata.category(c) == "Cc" for c in value):
        raise ValueError(f"{key!r} is too long or has control characters")
    return value.strip()


def _seats(order: Mapping[str, Any]) -> list[str]:
    value = order.get("seats")
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"'seats' must be a list of strings, got {value!r}")
    if not 1 <= len(value) <= _MAX_SEATS:
        raise ValueError(f"'seats' must hold 1 to {_MAX_SEATS} seats, got {len(value)}")
    seats: list[str] = []
    for seat in value:
        if (
            not isinstance(seat, str)
            or not seat.strip()
            or len(seat) > _MAX_SEAT_LEN
            or "," in seat
            or any(unicodedata.category(c) == "Cc" for c in seat)
        ):
            raise ValueError(f"bad seat label {seat!r} (non-empty, no comma, short)")
        seats.append(seat.strip())
    return seats


def _issued_at(order: Mapping[str, Any]) -> datetime:
    """``issued_at`` as an aware datetime; naive ISO strings are taken as UTC."""
    value = order.get("issued_at")
    if isinstance(value, bool):
        raise ValueError(f"'issued_at' must be an ISO string or epoch seconds, got {value!r}")
    try:
        if isinstance(value, int | float):
            when = datetime.fromtimestamp(value, tz=UTC)
        elif isinstance(value, str):
            when = datetime.fromisoformat(value)
        elif isinstance(value, datetime):
            when = value
        else:
            raise TypeError(type(value).__name__)
    except (TypeError, ValueError, OverflowError, OSError) as exc:
        raise ValueError(
            f"'issued_at' must be an ISO string or epoch seconds, got {value!r}"
        ) from exc
    if when.tzinfo is None:
        # Never fall back to the machine's local zone: the bytes must not depend on it.
        when = when.replace(tzinfo=UTC)
    # One instant, one rendering: 10:00+01:00, 09:00Z and the epoch float agree.
    return when.astimezone(UTC)


# --------------------------------------------------------------------------- QR payload


def qr_payload(order: Mapping[str, Any]) -> str:
    """The string the ticket's QR code encodes: ``boxoffice:ticket:<order>:<seat>,<seat>``."""
    return f"boxoffice:ticket:{_order_id(order)}:{','.join(_seats(order))}"


# --------------------------------------------------------------------------- rendering


# Letters with no Unicode decomposition to a base letter.
_NO_DECOMPOSITION = str.maketrans("ŁłĐđĦħıŀĿŦŧ", "LlDdHhilLTt")


def _printable(text: str) -> str:
    """Make ``text`` encodable in cp1252 (what the PDF core fonts can show).

    Characters outside cp1252 lose their accents (``ć`` -> ``c``) or become ``?``.
    """
    out: list[str] = []
    for ch in text:
        try:
            ch.encode("cp1252")
        except UnicodeEncodeError:
            base = "".join(
                c
                for c in unicodedata.normalize("NFKD", ch.translate(_NO_DECOMPOSITION))
                if not unicodedata.combining(c)
            )
            try:
                base.encode("cp1252")
            except UnicodeEncodeError:
                base = "?"
            out.append(base or "?")
        else:
            out.append(ch)
    return "".join(out)


def _fit(pdf: FPDF, text: str, width: float) -> str:
    """Truncate ``text`` with an ellipsis so it fits ``width`` mm in the current font."""
    if pdf.get_string_width(text) <= width:
        return text
    while text and pdf.get_string_width(text + "…") > width:
        text = text[:-1]
    return text.rstrip() + "…"


def _line(
    pdf: FPDF,
    text: str,
    *,
    size: float,
    style: str = "",
    height: float = 6.0,
    min_size: float | None = None,
) -> None:
    """One line of text across the page: shrink the font down to ``min_size``, then truncate."""
    text = _printable(text)
    width = _PAGE_W - 2 * _MARGIN
    pdf.set_font("Helvetica", style, size)
    while min_size is not None and size > min_size and pdf.get_string_width(text) > width:
        size -= 0.5
        pdf.set_font("Helvetica", style, size)
    pdf.set_x(_MARGIN)
    pdf.cell(width, height, _fit(pdf, text, width), new_x="LMARGIN", new_y="NEXT")


def _draw_qr(pdf: FPDF, matrix: Sequence[Sequence[int]]) -> None:
    """Draw the module matrix as filled rectangles (one per horizontal run of dark modules)."""
    n = len(matrix)
    module = _QR_BOX / (n + 2 * _QR_QUIET)
    x0 = (_PAGE_W - _QR_BOX) / 2 + _QR_QUIET * module
    y0 = _QR_TOP + _QR_QUIET * module
    pdf.set_fill_color(0, 0, 0)
    for r, row in enumerate(matrix):
        c = 0
        while c < n:
            if row[c] & 1:
                start = c
                while c < n and row[c] & 1:
                    c += 1
                pdf.rect(x0 + start * module, y0 + r * module, (c - start) * module, module, "F")
            else:
                c += 1


def render_ticket_bytes(order: Mapping[str, Any]) -> bytes:
    """Render the ticket PDF for the job body ``order``; same input, same bytes."""
    try:
        import segno
        from fpdf import FPDF
    except ImportError as exc:
        raise RuntimeError(_MISSING_EXTRA) from exc

    order_id = _order_id(order)
    event = _text(order, "event")
    seats = _seats(order)
    fan = _text(order, "fan")
    issued = _issued_at(order)
    payload = qr_payload(order)
    qr = segno.make(payload, error=QR_ERROR, micro=False)

    pdf = FPDF(orientation="P", unit="mm", format=(_PAGE_W, _PAGE_H))  # A6
    pdf.core_fonts_encoding = "cp1252"  # core fonts are WinAnsi: accents, € and … work
    pdf.set_creation_date(issued)
    pdf.set_title(_printable(f"BoxOffice ticket {order_id}"))
    pdf.set_author("BoxOffice")
    pdf.set_creator("fairq demo")
    pdf.set_producer("fairq demo")  # fpdf2 would otherwise embed its version string
    pdf.set_auto_page_break(False)
    pdf.set_margins(_MARGIN, _MARGIN, _MARGIN)
    pdf.add_page()

    pdf.set_draw_color(0, 0, 0)
    pdf.set_line_width(0.4)
    pdf.rect(4, 4, _PAGE_W - 8, _PAGE_H - 8, "D", round_corners=True, corner_radius=3)

    pdf.set_y(_MARGIN)
    _line(pdf, "BoxOffice", size=22, style="B", height=11)
    pdf.line(_MARGIN, pdf.get_y() + 1, _PAGE_W - _MARGIN, pdf.get_y() + 1)
    pdf.set_y(pdf.get_y() + 4)
    _line(pdf, event, size=14, style="B", height=8, min_size=9)
    _line(pdf, f"Seat{'s' if len(seats) > 1 else ''}: {', '.join(seats)}", size=11, min_size=8)
    _line(pdf, f"Fan: {fan}", size=11)
    _line(pdf, f"Order: {order_id}", size=11)
    _line(pdf, f"Issued: {issued:%Y-%m-%d %H:%M} UTC", size=9, height=5)

    _draw_qr(pdf, qr.matrix)

    pdf.set_y(_QR_TOP + _QR_BOX + 2)
    pdf.set_font("Helvetica", "", 7)
    pdf.set_x(_MARGIN)
    pdf.cell(_PAGE_W - 2 * _MARGIN, 4, "Show this code at the gate.", align="C")
    return bytes(pdf.output())


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    ) as tmp:
        try:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        except BaseException:
            tmp.close()
            os.unlink(tmp.name)
            raise
    try:
        os.chmod(tmp.name, 0o644)  # NamedTemporaryFile creates 0600
        os.replace(tmp.name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp.name)
        raise


def render_ticket(order: Mapping[str, Any], directory: str | os.PathLike[str]) -> pathlib.Path:
    """Render the ticket for the job body ``order`` to ``<directory>/<order>.pdf``.

    Idempotent: the bytes depend only on ``order``, the file is replaced atomically
    (temp file in the same directory, then ``os.replace``), and when the file already
    holds the same bytes it is left alone. Creates ``directory`` if missing and returns
    the file's path. Raises ValueError for a bad job body and RuntimeError when the
    ``fairq[demo]`` extra is not installed.
    """
    data = render_ticket_bytes(order)
    target_dir = pathlib.Path(directory)
    target_dir.mkdir(parents=True, exist_ok=True)
    path = target_dir / f"{_order_id(order)}.pdf"
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return path
    except FileNotFoundError:
        pass
    _write_atomically(path, data)
    return path


# --------------------------------------------------------------------------- sample jobs

_EVENTS = (
    "ev-88 Coliseu do Porto — Noite de Fado",
    "ev-88 Coliseu do Porto — Noite de Fado",
    "ev-88 Coliseu do Porto — Noite de Fado (matinée)",
)
_FIRST = ("Ana", "João", "Maria", "Pedro", "Inês", "Tiago", "Beatriz", "Rui", "Sofia", "Luís")
_LAST = ("Silva", "Santos", "Ferreira", "Pereira", "Oliveira", "Costa", "Gonçalves", "Araújo")
_ROWS, _ROW_SEATS = 30, 36  # per sector; _ROW_SEATS is a multiple of 4
_SALES_OPEN = datetime(2025, 6, 2, 10, 0, tzinfo=UTC).timestamp()


def ticket_job(i: int, rng: random.Random | None = None) -> dict[str, Any]:
    """A plausible ``GenerateTicketPdf`` job body for the ``i``-th order of the flash sale.

    Deterministic for a given ``i`` and seeded ``rng``; without ``rng`` a
    ``random.Random(i)`` is used, so the job for order ``i`` is always the same.
    """
    if rng is None:
        rng = random.Random(i)
    # Each order owns a block of 4 adjacent seats, so no two orders share a seat.
    block = 4 * i
    sector = "ABCDEF"[block // (_ROWS * _ROW_SEATS) % 6]
    row = block // _ROW_SEATS % _ROWS + 1
    first_seat = block % _ROW_SEATS + 1
    count = rng.choices((1, 2, 3, 4), weights=(30, 45, 10, 15))[0]
    return {
        "type": "GenerateTicketPdf",
        "order": f"o-{7000 + i}",
        "event": rng.choice(_EVENTS),
        "seats": [f"{sector}-{row}-{first_seat + k}" for k in range(count)],
        "fan": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
        "issued_at": round(_SALES_OPEN + i * 0.05 + rng.uniform(0, 0.05), 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fairq.demo.ticket_pdf [N] [DIR]``: render N sample tickets, print timings."""
    args = list(sys.argv[1:] if argv is None else argv)
    count = int(args[0]) if args else 10
    directory = args[1] if len(args) > 1 else "tickets"
    wall: list[float] = []
    cpu: list[float] = []
    for i in range(count):
        job = ticket_job(i)
        w0, c0 = time.perf_counter(), time.process_time()
        path = render_ticket(job, directory)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
        if i == 0:
            print(f"wrote {path} ({path.stat().st_size} bytes)")
    wall.sort()
    print(
        f"{count} tickets: median {wall[len(wall) // 2] * 1000:.1f} ms wall, "
        f"mean {sum(cpu) / len(cpu) * 1000:.1f} ms CPU per ticket"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
