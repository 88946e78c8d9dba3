"""hl-smi: parsing real-looking output, and a missing / failing / hanging / garbage tool never raising or hanging."""

from __future__ import annotations

import os

import pytest

from hpu_nb.runtime import hlsmi
from tests.fake_habana.fixture import fake_hlsmi  # noqa: F401  (fixture)
from tests.fake_habana.hlsmi import FakeHlSmi

MiB = 1 << 20

# `hl-smi -L` of a Gaudi2 box, trimmed to two cards (as printed by SynapseAI 1.12).
LISTING = """
================ HL-SMI LOG ================

Timestamp                               : Thu Nov 16 04:54:24 UTC 2023
Driver Version                          : 1.12.1-cb7a7bc
HL-SMI Version                          : hl-1.12.1-fw-46.0.5.0 (Oct 19 2023 - 01:19:50)

Attached AIPs                           : 2

[0] AIP (accel0) 0000:43:00.0
        Product Name                    : HL-225
        Model Number                    : F08GL0AIG032A
        Serial Number                   : AM50016138
        Module status                   : Operational
        Module ID                       : 3
        Firmware [FIT] Version          : Linux gaudi2 5.10.18-hl-gaudi2-1.12.1-fw-46.0.5-sec-6 #1 SMP PREEMPT
        Firmware [SPI] Version          : Preboot version hl-gaudi2-1.12.1-fw-46.0.5-sec-6 (Oct 12 2023 - 22:14:34)
        Firmware [OS] Version           : Zephyr 2.7.2-hl-gaudi2-1.12.1-fw-46.0.5-sec-6 (Oct 12 2023 - 22:14:47)
        PCI
                Bus                     : 0x43
                Bus Id                  : 0000:43:00.0
        Fan Speed
                                        : N/A
        Memory Type                     : HBM
        Memory Usage
                Total                   : 98304 MB
                Used                    : 768 MB
                Free                    : 97536 MB
        Temperature
                [ 1] On Chip 0          :  29 C
        Power Readings (54V PSU)
                Power Draw              : 50 W
[1] AIP (accel1) 0000:44:00.0
        Product Name                    : HL-225
        Serial Number                   : AM50016139
        Module ID                       : 1
        Firmware [OS] Version           : Zephyr 2.7.2-hl-gaudi2-1.12.1-fw-46.0.5-sec-6 (Oct 12 2023 - 22:14:47)
        Memory Usage
                Total                   : 98304 MB
                Used                    : 20480 MB
                Free                    : 77824 MB
"""


# -- parsers -------------------------------------------------------------------------------------------------
def test_parse_version_of_hl_smi_v() -> None:
    line = "Habanalabs hl-smi/hlml version hl-1.11.0-fw-45.1.1.1 (Aug 04 2023 - 02:48:21)"
    assert hlsmi.parse_version(line) == hlsmi.HlSmiVersion(synapseai="1.11.0", firmware="45.1.1.1")
    assert hlsmi.parse_version("HL-SMI Version : hl-1.18.0-fw-53.1.1.1 (Oct 02 2024)").synapseai == "1.18.0"


@pytest.mark.parametrize("text", ["", "hl-smi: command not found", "Habanalabs hl-smi/hlml version (unknown)",
                                  "hl-gaudi2-1.17.2-fw-51.5.1-sec-9"])
def test_parse_version_without_a_version_is_none(text: str) -> None:
    assert hlsmi.parse_version(text) is None


def test_parse_list_reads_driver_versions_and_each_card() -> None:
    listing = hlsmi.parse_list(LISTING)
    assert listing is not None
    assert listing.driver_version == "1.12.1-cb7a7bc"
    assert listing.version == hlsmi.HlSmiVersion("1.12.1", "46.0.5.0")
    assert listing.generation == "gaudi2"
    assert [c.index for c in listing.cards] == [0, 1]
    first, second = listing.cards
    assert (first.bus_id, first.product_name, first.serial_number, first.module_id) == (
        "0000:43:00.0", "HL-225", "AM50016138", 3)
    assert (first.generation, first.synapseai, first.firmware) == ("gaudi2", "1.12.1", "46.0.5")
    assert (first.memory_total, first.memory_used) == (98304 * MiB, 768 * MiB)
    assert (second.bus_id, second.memory_used, second.module_id) == ("0000:44:00.0", 20480 * MiB, 1)


@pytest.mark.parametrize(
    ("text", "generation", "release"),
    [
        ("Zephyr 2.7.2-hl-gaudi2-1.17.2-fw-51.5.1-sec-9", "gaudi2", None),
        ("    Firmware [SPI] Version          : Preboot version hl-gaudi2-1.18.0-fw-53.1.1-sec-9 (Oct 02 2024)",
         "gaudi2", None),
        ("Firmware [SPI] Version..........Preboot version hl-gaudi3-1.20.0-fw58.1.1-sec-2 (Feb 13 2025)", "gaudi3",
         None),
        ("[0] AIP (accel0) 0000:17:00.0\n  Product Name : HL-205\n", "gaudi", None),
        ("Driver Version : 1.17.2-4ab2e36\n[0] AIP (accel0) 0000:17:00.0\n  Product Name : HL-325L\n", "gaudi3",
         "1.17.2-4ab2e36"),
    ],
)
def test_parse_list_finds_the_generation_in_partial_output(text: str, generation: str, release: str | None) -> None:
    listing = hlsmi.parse_list(text)
    assert listing is not None and listing.generation == generation
    assert listing.driver_version == release


@pytest.mark.parametrize("text", ["", "No devices found\n", "\x1b[31m@@ 0xDEADBEEF ;; ##\nSegmentation fault\n"])
def test_parse_list_of_unknown_text_is_none(text: str) -> None:
    assert hlsmi.parse_list(text) is None


def test_generation_of_product_names() -> None:
    assert [hlsmi.generation_of_product(n) for n in ("HL-205", "HL-225", "hl-225b", "HL-325L", "GX-1")] == [
        "gaudi", "gaudi2", "gaudi2", "gaudi3", None]


def test_parse_query_csv() -> None:
    text = (
        "0, HL-225, 98304, 768, 0, 30, 84\n"
        "1, HL-225, 98304, 20480, 97, 41, 512\n"
        "2, HL-225, 98304, N/A, N/A, 28, N/A\n"
    )
    facts = hlsmi.parse_query(text)
    assert facts is not None and [f.index for f in facts] == [0, 1, 2]
    second = facts[1]
    assert (second.name, second.memory_total, second.memory_used) == ("HL-225", 98304 * MiB, 20480 * MiB)
    assert (second.utilization, second.temperature, second.power, second.source) == (97.0, 41.0, 512.0, "hl-smi")
    third = facts[2]
    assert (third.memory_used, third.utilization, third.power, third.temperature) == (None, None, None, 28.0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "index, name, memory.total\n",  # a header, not data
        "0, HL-225, 98304, 768, 0, 30\n",  # a column missing
        "0, HL-225, 98304, lots, 0, 30, 84\n",  # not a number
        "x, HL-225, 98304, 768, 0, 30, 84\n",  # no index
        "0, HL-225, 98304, 768, 0, 30, 84\nSegmentation fault\n",  # a good row, then garbage
    ],
)
def test_parse_query_rejects_malformed_tables(text: str) -> None:
    assert hlsmi.parse_query(text) is None


# -- running the tool ----------------------------------------------------------------------------------------
def test_normal_tool_answers_every_question(fake_hlsmi: FakeHlSmi) -> None:  # noqa: F811
    fake_hlsmi.generation, fake_hlsmi.device_count, fake_hlsmi.memory_used_mib = "gaudi3", 4, [1024, 0, 0, 4096]
    fake_hlsmi.write()
    version = hlsmi.read_version()
    assert version.ok and version.value == hlsmi.HlSmiVersion("1.17.2", "51.5.1.0")
    listing = hlsmi.read_listing()
    assert listing.ok and listing.value.generation == "gaudi3" and len(listing.value.cards) == 4
    assert listing.value.driver_version == "1.17.2-4ab2e36"
    facts = hlsmi.read_facts()
    assert facts.ok and [f.memory_used for f in facts.value] == [1024 * MiB, 0, 0, 4096 * MiB]
    assert {f.memory_total for f in facts.value} == {131072 * MiB}
    assert fake_hlsmi.invocations() == [["-v"], ["-L"], ["-Q", ",".join(hlsmi.QUERY_FIELDS), "-f",
                                                          "csv,noheader,nounits"]]


def test_missing_tool_is_a_reason_not_an_error(fake_hlsmi: FakeHlSmi) -> None:  # noqa: F811
    fake_hlsmi.mode = "missing"
    for read in (hlsmi.read_version, hlsmi.read_listing, hlsmi.read_facts):
        outcome = read()
        assert outcome.value is None and "not on PATH" in outcome.reason


def test_failing_tool_reports_its_exit_status_and_message(fake_hlsmi: FakeHlSmi) -> None:  # noqa: F811
    fake_hlsmi.mode = "failing"
    outcome = hlsmi.read_facts()
    assert outcome.value is None
    assert "exit status 1" in outcome.reason and "driver is not loaded" in outcome.reason


def test_hanging_tool_is_stopped_at_the_timeout(fake_hlsmi: FakeHlSmi) -> None:  # noqa: F811
    fake_hlsmi.mode = "hanging"
    timeout = 0.5
    outcome = hlsmi.read_version(timeout=timeout)  # the fake never answers: only the timeout lets this return
    assert outcome.value is None and "did not answer within 0.5 s" in outcome.reason
    (pid,) = fake_hlsmi.pids()
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left sleeping
        os.kill(pid, 0)


def test_garbage_output_is_a_reason(fake_hlsmi: FakeHlSmi) -> None:  # noqa: F811
    fake_hlsmi.mode = "garbage"
    for read, words in ((hlsmi.read_version, "no version"), (hlsmi.read_listing, "nothing recognisable"),
                        (hlsmi.read_facts, "unreadable table")):
        outcome = read()
        assert outcome.value is None and words in outcome.reason and "DEADBEEF" in outcome.reason
