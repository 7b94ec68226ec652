# A thin shim so `python setup.py ...` and old tools work; pyproject.toml holds the metadata.
from setuptools import setup

setup()
