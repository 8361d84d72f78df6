"""setuptools hook: records the libcastle checkout this package is built from, so that an installed
copy still finds that checkout's build/libcastle.so (castle/_lib.py reads castle/_checkout.py)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self):
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(self.build_lib, "castle", "_checkout.py"), "w") as f:
            f.write('"""Written by setup.py: the libcastle checkout this copy was installed from."""\n')
            f.write(f"CHECKOUT = {os.path.dirname(here)!r}\n")


setup(cmdclass={"build_py": BuildPy})
