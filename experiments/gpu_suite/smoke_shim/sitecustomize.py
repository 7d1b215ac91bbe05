"""CPU smoke run only (run.sh puts this folder on PYTHONPATH when torchvision cannot be imported):
``import torchvision`` yields its pure-Python package without running its ``__init__``, whose compiled
operators do not load beside a CPU-only torch of another build. The benchmarks use only
``torchvision.transforms`` and the box losses of ``torchvision.ops`` (as `bench_sam2.import_torchvision`)."""

import importlib.abc
import importlib.machinery
import sys


class _PackageOnly(importlib.abc.Loader):
    def __init__(self, locations):
        self.locations = locations

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = self.locations
        module.__version__ = "pure-python package (smoke shim)"


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torchvision":
            return None
        found = importlib.machinery.PathFinder.find_spec(name, path)
        if found is None or not found.submodule_search_locations:
            return None
        locations = list(found.submodule_search_locations)
        spec = importlib.machinery.ModuleSpec(name, _PackageOnly(locations), is_package=True)
        spec.submodule_search_locations = locations
        return spec


sys.meta_path.insert(0, _TorchvisionFinder())
