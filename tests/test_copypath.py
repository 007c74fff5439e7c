"""The pure copy-path choice and CTA sizing (FIELD.md sections 1 and 3, issue 4)."""

import math

import pytest

from kvsim.core.copypath import CopyPath, choose_copy_path, copy_ctas

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
    import kvsim.core.copypath as m
    src = open(m.__file__).read()
    for banned in ("simpy", "cupy", "time", "threading", "open(", "pydantic", "yaml"):
        assert f"import {banned}" not in src and not (banned == "open(" and banned in src)


def test_copy_ctas_headroom_multiplies_the_link():
    # 55.5 GB/s at 2.4 GB/s a CTA: 24 CTAs; twice the link: 48; below 1 refused
    from kvsim.core.copypath import copy_ctas as cc
    assert cc(PCIE, 2.4e9, 132) == 24 and cc(PCIE, 2.4e9, 132, headroom=2.0) == 48
    with pytest.raises(ValueError, match="headroom"):
        cc(PCIE, 2.4e9, 132, headroom=0.5)


def test_a_copy_path_setting_per_direction():
    from kvsim.core.copypath import force_per_direction
    assert force_per_direction(None) == force_per_direction("auto") == {"h2d": None, "d2h": None}
    assert force_per_direction("sm_kernel") == {"h2d": CopyPath.SM_KERNEL, "d2h": CopyPath.SM_KERNEL}
    assert force_per_direction({"h2d": "copy_engine", "d2h": "auto"}) == {"h2d": CopyPath.COPY_ENGINE,
                                                                          "d2h": None}
    assert force_per_direction({"d2h": CopyPath.SM_KERNEL}) == {"h2d": None, "d2h": CopyPath.SM_KERNEL}
    with pytest.raises(ValueError, match=r"copy_path\.d2h: got 'dma'"):
        force_per_direction({"h2d": "auto", "d2h": "dma"})
    with pytest.raises(ValueError, match="unknown direction"):
        force_per_direction({"up": "auto"})


def test_sm_ctas_auto_or_a_count_within_the_slots():
    from kvsim.core.copypath import sm_ctas
    assert sm_ctas("auto", PCIE, 2.4e9, 132) == copy_ctas(PCIE, 2.4e9, 132) == 24
    assert sm_ctas(None, PCIE, 2.4e9, 132, headroom=2.0) == 48
    assert sm_ctas(7, PCIE, 2.4e9, 132) == 7  # a count is taken as it is (odd too)
    for bad in (0, -2, 133, True, 2.5, "many"):
        with pytest.raises(ValueError, match="sm_ctas"):
            sm_ctas(bad, PCIE, 2.4e9, 132)
