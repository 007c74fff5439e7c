"""The pure copy-path choice and CTA sizing (FIELD.md sections 1 and 3, issue 4)."""

import math

import pytest

from kvsim.core.datapath.copypath import (CopyPath, choose_copy_path, copy_ctas, page_straddles,
                                 registration_forces_kernel, straddling_pages)

PCIE = 55.5e9
C2C = 340e9
HOST_PER_COPY = 2.5e-6
MiB = 2**20


def test_large_pages_use_the_copy_engine_on_pcie_and_on_c2c():
    # FIELD s.1: the copy engine is the default on both links
    assert choose_copy_path("pcie", 4 * MiB, HOST_PER_COPY, PCIE) is CopyPath.COPY_ENGINE
    assert choose_copy_path("c2c", 4 * MiB, HOST_PER_COPY, C2C) is CopyPath.COPY_ENGINE


def test_small_pages_default_to_the_sm_kernel():
    # 16 KiB / 2.5 us = 6.6 GB/s of host-bound copy-engine rate, far below the link
    assert choose_copy_path("pcie", 16384, HOST_PER_COPY, PCIE) is CopyPath.SM_KERNEL
    # the threshold sits at page = per_copy * link: 2.5 us * 55.5 GB/s = 138,750 bytes
    assert choose_copy_path("pcie", 138_749, HOST_PER_COPY, PCIE) is CopyPath.SM_KERNEL
    assert choose_copy_path("pcie", 138_751, HOST_PER_COPY, PCIE) is CopyPath.COPY_ENGINE
    # the faster C2C link moves the threshold up: 256 KiB is still host-bound there
    assert choose_copy_path("c2c", 256 * 1024, HOST_PER_COPY, C2C) is CopyPath.SM_KERNEL


def test_zero_host_cost_never_prefers_the_kernel():
    assert choose_copy_path("pcie", 4096, 0.0, PCIE) is CopyPath.COPY_ENGINE


def test_chunked_registration_forces_the_kernel():
    assert choose_copy_path("pcie", 4 * MiB, HOST_PER_COPY, PCIE,
                            chunked_registration=True) is CopyPath.SM_KERNEL


def test_an_explicit_override_wins():
    assert choose_copy_path("c2c", 4 * MiB, HOST_PER_COPY, C2C,
                            force=CopyPath.SM_KERNEL) is CopyPath.SM_KERNEL
    assert choose_copy_path("pcie", 4096, HOST_PER_COPY, PCIE,
                            force=CopyPath.COPY_ENGINE) is CopyPath.COPY_ENGINE
    assert choose_copy_path("pcie", 4096, HOST_PER_COPY, PCIE, force="sm_kernel") is CopyPath.SM_KERNEL


def test_forcing_the_copy_engine_over_chunked_registration_is_refused():
    with pytest.raises(ValueError, match="chunked"):
        choose_copy_path("pcie", 4 * MiB, HOST_PER_COPY, PCIE, force=CopyPath.COPY_ENGINE,
                         chunked_registration=True)


@pytest.mark.parametrize("args", [("nvlink", MiB, 1e-6, PCIE), ("pcie", 0, 1e-6, PCIE),
                                  ("pcie", MiB, -1.0, PCIE), ("pcie", MiB, 1e-6, 0.0)])
def test_bad_arguments_are_refused(args):
    with pytest.raises(ValueError):
        choose_copy_path(*args)


def test_copy_ctas_by_littles_law():
    # HARDWARE.md: ~2.3-2.4 GB/s a CTA on PCIe, ~24 CTAs saturate the link
    assert copy_ctas(PCIE, 2.4e9, 132) == 24          # 23.1 -> 24
    assert copy_ctas(55.3e9, 2.3e9, 132) == 26        # 24.04 -> 25 -> even 26
    # FIELD s.3: C2C, ~44 GiB/s onboard a CTA: 340e9 / 47.2e9 = 7.2 -> 8
    assert copy_ctas(C2C, 44 * 2**30, 132) == 8
    assert copy_ctas(295e9, 40 * 2**30, 132) == 8     # 6.9 -> 7 -> 8


def test_copy_ctas_exact_multiple_is_not_rounded_past_it():
    assert copy_ctas(20e9, 2.5e9, 132) == 8
    assert copy_ctas(55.5e9, 55.5e9 / 20, 132) == 20


def test_copy_ctas_at_least_two_and_capped_even():
    assert copy_ctas(1e9, 100e9, 132) == 2
    assert copy_ctas(1e12, 1e9, 33) == 32
    assert copy_ctas(1e12, 1e9, 2) == 2
    with pytest.raises(ValueError):
        copy_ctas(1e9, 1e9, 1)
    with pytest.raises(ValueError):
        copy_ctas(0.0, 1e9, 8)


def test_copy_ctas_is_always_even():
    for link in (1e9, 7e9, 33.3e9, 55.5e9, 340e9):
        for cta in (0.9e9, 2.3e9, 40e9):
            n = copy_ctas(link, cta, 132)
            assert n % 2 == 0 and n >= 2 and n >= min(130, math.ceil(link / cta))


def test_copypath_module_is_pure():
    import kvsim.core.datapath.copypath as m
    src = open(m.__file__).read()
    for banned in ("simpy", "cupy", "time", "threading", "open(", "pydantic", "yaml"):
        assert f"import {banned}" not in src and not (banned == "open(" and banned in src)


def test_copy_ctas_headroom_multiplies_the_link():
    # 55.5 GB/s at 2.4 GB/s a CTA: 24 CTAs; twice the link: 48; below 1 refused
    from kvsim.core.datapath.copypath import copy_ctas as cc
    assert cc(PCIE, 2.4e9, 132) == 24 and cc(PCIE, 2.4e9, 132, headroom=2.0) == 48
    with pytest.raises(ValueError, match="headroom"):
        cc(PCIE, 2.4e9, 132, headroom=0.5)


def test_a_copy_path_setting_per_direction():
    from kvsim.core.datapath.copypath import force_per_direction
    assert force_per_direction(None) == force_per_direction("auto") == {"h2d": None, "d2h": None}
    assert force_per_direction("sm_kernel") == {"h2d": CopyPath.SM_KERNEL, "d2h": CopyPath.SM_KERNEL}
    assert force_per_direction({"h2d": "copy_engine", "d2h": "auto"}) == {"h2d": CopyPath.COPY_ENGINE,
                                                                          "d2h": None}
    assert force_per_direction({"d2h": CopyPath.SM_KERNEL}) == {"h2d": None, "d2h": CopyPath.SM_KERNEL}
    with pytest.raises(ValueError, match=r"copy_path\.d2h: got 'dma'"):
        force_per_direction({"h2d": "auto", "d2h": "dma"})
    with pytest.raises(ValueError, match="unknown direction"):
        force_per_direction({"up": "auto"})


def test_sm_ctas_auto_or_a_count():
    """A count is taken as it is; its range is the config model's and the profile fit's
    (``tests/test_copy_knobs.py``: bad settings refused naming engine.sm_ctas)."""
    from kvsim.core.datapath.copypath import sm_ctas
    assert sm_ctas("auto", PCIE, 2.4e9, 132) == copy_ctas(PCIE, 2.4e9, 132) == 24
    assert sm_ctas(None, PCIE, 2.4e9, 132, headroom=2.0) == 48
    assert sm_ctas(7, PCIE, 2.4e9, 132) == 7  # a count is taken as it is (odd too)


# -- the link kind and chunked host registration (seed 000) --------------------------------

def test_kernel_opt_in_applies_only_on_coherent_links():
    # the seed's truth table: the copy engine by default on every link; the opt-in picks the
    # SM kernel on a coherent link only; chunked registration forces the kernel everywhere
    for kind, link in (("pcie", PCIE), ("c2c", C2C)):
        assert choose_copy_path(kind, 4 * MiB, HOST_PER_COPY, link) is CopyPath.COPY_ENGINE
        assert choose_copy_path(kind, 4 * MiB, HOST_PER_COPY, link,
                                chunked_registration=True) is CopyPath.SM_KERNEL
    assert choose_copy_path("c2c", 4 * MiB, HOST_PER_COPY, C2C,
                            kernel_on_coherent_link=True) is CopyPath.SM_KERNEL
    assert choose_copy_path("pcie", 4 * MiB, HOST_PER_COPY, PCIE,
                            kernel_on_coherent_link=True) is CopyPath.COPY_ENGINE
    # a forced path still wins over the opt-in
    assert choose_copy_path("c2c", 4 * MiB, HOST_PER_COPY, C2C, force=CopyPath.COPY_ENGINE,
                            kernel_on_coherent_link=True) is CopyPath.COPY_ENGINE


def test_a_page_straddles_when_a_unit_boundary_falls_inside_it():
    unit = 512 * MiB
    assert not page_straddles(0, 4 * MiB, unit)
    assert not page_straddles(unit - 4 * MiB, 4 * MiB, unit)  # ends exactly on the boundary
    assert page_straddles(unit - 4 * MiB + 1, 4 * MiB, unit)
    assert page_straddles(510 * MiB, 5 * MiB, unit)           # 510..515 MiB crosses 512
    assert not page_straddles(515 * MiB, 5 * MiB, unit)


def test_straddling_pages_of_5mib_pages_in_512mib_units():
    # 5 MiB pages from 0: page 102 covers 510..515 MiB and crosses 512 MiB; page 204 covers
    # 1020..1025 MiB and crosses 1024 MiB; 205 pages end at 1025 MiB
    assert straddling_pages(5 * MiB, 512 * MiB, 205) == [102, 204]
    assert straddling_pages(5 * MiB, 512 * MiB, 204) == [102]  # (ends at 1020 MiB)
    assert straddling_pages(5 * MiB, 512 * MiB, 102) == []     # ends at 510 MiB
    # units a multiple of the page size: no page straddles, from an aligned base
    assert straddling_pages(4 * MiB, 512 * MiB, 1000) == []
    # ... but a base off the page grid makes every unit boundary split a page: 1..1025 MiB
    # holds the boundaries at 512 MiB (page 127: 509..513) and 1024 MiB (page 255)
    assert straddling_pages(4 * MiB, 512 * MiB, 256, base=MiB) == [127, 255]


def test_straddling_pages_agrees_with_a_page_by_page_check():
    import random
    rng = random.Random(24)
    for _ in range(400):
        page = rng.choice([1, 3, 4, 5, 8, 12, 16, 48]) * rng.choice([1, 1024])
        unit = rng.choice([page * rng.randint(1, 9), rng.randint(1, 200) * 1024, rng.randint(1, 97)])
        n = rng.randint(0, 300)
        base = rng.choice([0, rng.randint(0, 5 * unit)])
        want = [i for i in range(n) if page_straddles(base + i * page, page, unit)]
        assert straddling_pages(page, unit, n, base) == want, (page, unit, n, base)
        assert registration_forces_kernel(page, unit, n, base) is bool(want)


def test_registration_forces_the_kernel_only_where_pages_could_straddle():
    assert not registration_forces_kernel(5 * MiB, None, 10_000)     # one registration
    assert not registration_forces_kernel(4 * MiB, 512 * MiB, 10_000)  # units of whole pages
    assert registration_forces_kernel(5 * MiB, 512 * MiB, 10_000)
    assert not registration_forces_kernel(5 * MiB, 512 * MiB, 100)   # all in the first unit
    assert registration_forces_kernel(1024 * MiB, 512 * MiB, 1)      # a page above the unit


@pytest.mark.parametrize("args", [(0, MiB, 1), (MiB, 0, 1), (MiB, MiB, -1), (MiB, MiB, 1, -1)])
def test_straddling_pages_refuses_bad_arguments(args):
    with pytest.raises(ValueError):
        straddling_pages(*args)


def test_a_gpu_to_host_headroom_of_its_own():
    """``sm.cta_headroom_d2h`` sizes GPU -> host alone (both backends' ``direction_ctas`` and
    the cost rule's), host -> GPU keeps ``cta_headroom``; below 1 is refused, named."""
    from pydantic import ValidationError

    from kvsim.config.hardware import HardwareProfile, load_profile
    from kvsim.core.datapath.copypath import direction_ctas
    from kvsim.core.datapath.pathcost import cost_inputs
    base = load_profile("h200-pcie-calibrated")
    d = base.model_dump()
    d["sm"].update(cta_headroom=2.0, cta_headroom_d2h=None)
    same = HardwareProfile.model_validate(d)
    d["sm"]["cta_headroom_d2h"] = 1.0
    own = HardwareProfile.model_validate(d)
    lk, sm, pb = base.link, base.sm, 256 * 1024
    on, off = sm.cta_rate("h2d", pb), sm.cta_rate("d2h", pb)
    assert direction_ctas(None, same, pb) == {"h2d": copy_ctas(lk.h2d, on, sm.copy_cta_slots, 2.0),
                                              "d2h": copy_ctas(lk.d2h, off, sm.copy_cta_slots, 2.0)}
    got = direction_ctas(None, own, pb)
    assert got == {"h2d": direction_ctas(None, same, pb)["h2d"],
                   "d2h": copy_ctas(lk.d2h, off, sm.copy_cta_slots, 1.0)}
    assert got["d2h"] < direction_ctas(None, same, pb)["d2h"]
    assert cost_inputs(own, pb, None).ctas_one == got
    assert direction_ctas(12, own, pb) == {"h2d": 12, "d2h": 12}  # a count set is taken as it is
    d["sm"]["cta_headroom_d2h"] = 0.5
    with pytest.raises(ValidationError, match="cta_headroom_d2h"):
        HardwareProfile.model_validate(d)
