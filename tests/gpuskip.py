"""Whether this machine can run the GPU tests (CuPy and a CUDA device), for their skip."""


def have_gpu() -> bool:
    try:
        import cupy as cp
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False
