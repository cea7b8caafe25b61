"""Runs one scenario of shim_check.c from Python, the way a PyTorch extension reaches CUDA: the
scenario code lives in a shared library linked against libcudart and loaded with ctypes
(RTLD_LOCAL, Python's default for extension-like libraries), so the runtime is not in the global
symbol scope and the shim has to find it by soname.

usage: python3 driver.py LIBRARY SCENARIO
"""
import ctypes
import sys


def main() -> int:
    library, scenario = sys.argv[1], sys.argv[2]
    lib = ctypes.CDLL(library, mode=ctypes.RTLD_LOCAL)
    lib.shim_check_run.argtypes = [ctypes.c_char_p]
    lib.shim_check_run.restype = ctypes.c_int
    return lib.shim_check_run(scenario.encode())


if __name__ == "__main__":
    sys.exit(main())
