"""oelm's version, in one place: ``oelm.__version__`` is this, and the records that name the version
oelm ran as (a run's environment, a checkpoint's ``versions``) read it from here when oelm runs from a
source tree that is not installed, without importing the package root (the layer above them)."""

__version__ = "0.1.0"
