"""Whether this machine has the NVIDIA driver's library, as Tessera's CUDA module loader asks."""
import ctypes


def has_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False
