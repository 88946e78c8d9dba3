"""Device facts from Habana's `hl-smi` command line tool: always with a timeout, never raising.

`hl-smi` may be missing (containers without the driver tools), fail (driver not loaded) or hang (a wedged
card), so every call runs in its own process group with a timeout and comes back as an `Outcome`: a
value, or None and a reason that %hpu_info can show. The parsers are pure functions over the text.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from hpu_nb.runtime.base import DeviceFacts
from hpu_nb.runtime.generations import generation_of_board

T = TypeVar("T")

DEFAULT_TIMEOUT = 2.0
EXECUTABLE = "hl-smi"
QUERY_FIELDS = (
    "index",
    "name",
    "memory.total",
    "memory.used",
    "utilization.aip",
    "temperature.aip",
    "power.draw",
)
MiB = 1 << 20

# "hl-1.11.0-fw-45.1.1.1": SynapseAI release after "hl-", firmware after "fw-".
_VERSION_RE = re.compile(r"(?<![\w-])hl-(\d+(?:\.\d+)+)(?:-fw-(\d+(?:\.\d+)*))?")
# "2.7.2-hl-gaudi2-1.17.2-fw-51.5.1-sec-9": generation, SynapseAI release and firmware of one card.
_CARD_FW_RE = re.compile(r"hl-(gaudi\d*)-(\d+(?:\.\d+)+)-fw-?(\d+(?:\.\d+)*)", re.IGNORECASE)
# "[0] AIP (accel0) 0000:43:00.0": the first line of one card in `hl-smi -L`.
_BUS_ID = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]"
_CARD_HEADER_RE = re.compile(rf"^\s*\[(\d+)\]\s+AIP\b.*?(\b{_BUS_ID})?\s*$")
_KEY_VALUE_RE = re.compile(r"^\s*([A-Za-z][^:]*?)\s*:\s*(.*?)\s*$")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """A value, or None and the reason there is none (shown to the user instead of a traceback)."""

    value: T | None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class HlSmiVersion:
    """What `hl-smi -v` says: the SynapseAI release and the firmware version."""

    synapseai: str
    firmware: str | None


@dataclass
class HlSmiCard:
    """One card of `hl-smi -L`."""

    index: int
    bus_id: str | None = None
    product_name: str | None = None
    serial_number: str | None = None
    module_id: int | None = None
    generation: str | None = None  # "gaudi", "gaudi2", "gaudi3"
    synapseai: str | None = None  # release the firmware was built for
    firmware: str | None = None
    memory_total: int | None = None  # bytes
    memory_used: int | None = None  # bytes


@dataclass
class HlSmiListing:
    """What `hl-smi -L` says about the machine and each card."""

    driver_version: str | None = None
    version: HlSmiVersion | None = None
    cards: list[HlSmiCard] = field(default_factory=list)
    generation: str | None = None  # the first generation named anywhere in the listing


# -- running the tool -------------------------------------------------------------------------------------------
def run_hlsmi(args: list[str] | tuple[str, ...], timeout: float = DEFAULT_TIMEOUT) -> Outcome[str]:
    """Run `hl-smi ARGS` and return its standard output; the whole process group is killed at the timeout."""
    command = " ".join([EXECUTABLE, *args])
    executable = shutil.which(EXECUTABLE)
    if executable is None:
        return Outcome(None, f"{EXECUTABLE} is not on PATH (Habana's driver tools are not installed here)")
    try:
        process = subprocess.Popen(
            [executable, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # so a timeout can kill anything hl-smi started as well
        )
    except OSError as err:
        return Outcome(None, f"`{command}` could not start: {err}")
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return Outcome(None, f"`{command}` did not answer within {timeout:g} s and was stopped")
    if process.returncode != 0:
        detail = (stderr or stdout or "").strip().splitlines()
        suffix = f": {detail[0][:200]}" if detail else ""
        return Outcome(None, f"`{command}` failed with exit status {process.returncode}{suffix}")
    return Outcome(stdout)


def _kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
    deadline = time.monotonic() + 1.0
    try:
        process.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # a grandchild kept the pipes open: give up on them
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        process.wait(timeout=1.0)


# -- parsers (pure) ----------------------------------------------------------------------------------------------
def parse_version(text: str) -> HlSmiVersion | None:
    """`Habanalabs hl-smi/hlml version hl-1.11.0-fw-45.1.1.1 (...)` -> HlSmiVersion('1.11.0', '45.1.1.1')."""
    match = _VERSION_RE.search(text or "")
    if match is None:
        return None
    return HlSmiVersion(synapseai=match.group(1), firmware=match.group(2))


def generation_of_product(product_name: str) -> str | None:
    """'HL-225' -> 'gaudi2' (the board's product name tells the generation)."""
    generation = generation_of_board(product_name)
    return generation.key if generation is not None else None


def parse_list(text: str) -> HlSmiListing | None:
    """Read `hl-smi -L` (or any part of it, e.g. `hl-smi -L | grep SPI`); None when nothing in it is known."""
    listing = HlSmiListing()
    card: HlSmiCard | None = None
    section: str | None = None  # the nested block we are in ("Memory Usage", ...)
    for line in (text or "").splitlines():
        header = _CARD_HEADER_RE.match(line)
        if header:
            card = HlSmiCard(index=int(header.group(1)), bus_id=header.group(2))
            listing.cards.append(card)
            section = None
            continue
        fw = _CARD_FW_RE.search(line)
        if fw:
            generation, release, firmware = fw.group(1).lower(), fw.group(2), fw.group(3)
            listing.generation = listing.generation or generation
            if card is not None:
                card.generation = card.generation or generation
                card.synapseai = card.synapseai or release
                card.firmware = card.firmware or firmware
        pair = _KEY_VALUE_RE.match(line)
        if pair is None:
            stripped = line.strip()
            if stripped and ":" not in stripped and not stripped.startswith("="):
                section = stripped  # a block title such as "Memory Usage"
            continue
        key, value = pair.group(1), pair.group(2)
        if card is None:
            if key == "Driver Version":
                listing.driver_version = value or None
            elif key == "HL-SMI Version":
                listing.version = parse_version(value)
            continue
        if key == "Product Name":
            card.product_name = value
            card.generation = card.generation or generation_of_product(value)
            listing.generation = listing.generation or card.generation
        elif key == "Serial Number":
            card.serial_number = value
        elif key == "Module ID":
            card.module_id = _to_int(value)
        elif key == "Bus Id" and card.bus_id is None:
            card.bus_id = value
        elif section == "Memory Usage" and key in ("Total", "Used"):
            size = _megabytes(value)
            if key == "Total":
                card.memory_total = size
            else:
                card.memory_used = size
    known = listing.cards or listing.generation or listing.driver_version or listing.version
    return listing if known else None


def parse_query(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> list[DeviceFacts] | None:
    """Read `hl-smi -Q FIELDS -f csv,noheader,nounits`; None unless every row is a well-formed card."""
    rows = [row for row in csv.reader((text or "").splitlines(), skipinitialspace=True) if any(c.strip() for c in row)]
    if not rows:
        return None
    facts = []
    for row in rows:
        if len(row) != len(fields):
            return None
        values = dict(zip(fields, (cell.strip() for cell in row)))
        index = _to_int(values.get("index", ""))
        if index is None or index < 0:
            return None
        try:
            total, used = _mib(values.get("memory.total")), _mib(values.get("memory.used"))
            utilization, temperature = _number(values.get("utilization.aip")), _number(values.get("temperature.aip"))
            power = _number(values.get("power.draw"))
        except ValueError:
            return None
        facts.append(
            DeviceFacts(
                index=index,
                name=values.get("name") or "Gaudi",
                memory_total=total,
                memory_used=used,
                utilization=utilization,
                temperature=temperature,
                power=power,
                source="hl-smi",
            )
        )
    return facts


def _to_int(text: str) -> int | None:
    try:
        return int(text.strip(), 0)
    except (ValueError, AttributeError):
        return None


def _number(text: str | None) -> float | None:
    """'84' -> 84.0; 'N/A' or missing -> None; anything else is not hl-smi output."""
    if text is None or text.strip() in ("", "N/A", "[N/A]", "[Not Supported]"):
        return None
    value = float(text.strip().rstrip("%").rstrip("WC").strip())
    if value != value or value < 0:  # NaN or negative: not a reading
        raise ValueError(text)
    return value


def _mib(text: str | None) -> int | None:
    value = _number(text)
    return None if value is None else int(value * MiB)


def _megabytes(text: str) -> int | None:
    """'98304 MB' in `hl-smi -L` (the tool's MB are MiB: 98304 MB is a 96 GiB Gaudi2)."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*(MB|MiB)?\s*$", text)
    return int(float(match.group(1)) * MiB) if match else None


# -- the questions the Gaudi backend asks ------------------------------------------------------------------------
def read_version(timeout: float = DEFAULT_TIMEOUT) -> Outcome[HlSmiVersion]:
    """SynapseAI release and firmware from `hl-smi -v`."""
    run = run_hlsmi(["-v"], timeout)
    if not run.ok:
        return Outcome(None, run.reason)
    version = parse_version(run.value or "")
    if version is None:
        return Outcome(None, f"`{EXECUTABLE} -v` printed no version: {_excerpt(run.value)}")
    return Outcome(version)


def read_listing(timeout: float = DEFAULT_TIMEOUT) -> Outcome[HlSmiListing]:
    """Driver version, generation and per-card facts from `hl-smi -L`."""
    run = run_hlsmi(["-L"], timeout)
    if not run.ok:
        return Outcome(None, run.reason)
    listing = parse_list(run.value or "")
    if listing is None:
        return Outcome(None, f"`{EXECUTABLE} -L` printed nothing recognisable: {_excerpt(run.value)}")
    return Outcome(listing)


def read_facts(timeout: float = DEFAULT_TIMEOUT) -> Outcome[list[DeviceFacts]]:
    """Live per-card memory, utilization, temperature and power from `hl-smi -Q ... -f csv,noheader,nounits`."""
    run = run_hlsmi(["-Q", ",".join(QUERY_FIELDS), "-f", "csv,noheader,nounits"], timeout)
    if not run.ok:
        return Outcome(None, run.reason)
    facts = parse_query(run.value or "")
    if facts is None:
        return Outcome(None, f"`{EXECUTABLE} -Q` printed an unreadable table: {_excerpt(run.value)}")
    return Outcome(facts)


def _excerpt(text: str | None, limit: int = 80) -> str:
    flat = " ".join((text or "").split())
    if not flat:
        return "(empty output)"
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")
