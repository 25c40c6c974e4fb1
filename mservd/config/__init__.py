"""Server and per-model settings: where every value comes from, and its one precedence order.

:func:`load` (``loading.py``) resolves server settings as defaults → ``config.properties``
(``properties.py``) → ``TS_<KEY>`` environment variables (only when ``enable_envvars_config``
is on) → command-line overrides, and returns one frozen :class:`Settings` (``settings.py``).
:func:`resolve_model_settings` (``model_settings.py``) resolves one model version's settings as
defaults → the ``models=`` block of ``config.properties`` → the archive's ``model-config.yaml``
(``yaml_files.py``) → the management API call, and returns one frozen :class:`ModelSettings`.

Both collect every problem before raising one :class:`ConfigError` (``convert.py``), so a user
fixes a file in one pass. Nothing here keeps state: no module-level settings object, no caching;
``Settings`` is passed explicitly to whoever needs it, and nothing is read but the files named.
"""

from mservd.config.convert import ConfigError, parse_address, to_bool, to_int
from mservd.config.loading import load
from mservd.config.model_settings import ModelSettings, resolve_model_settings
from mservd.config.properties import parse_properties
from mservd.config.settings import Settings, describe_settings
from mservd.config.yaml_files import read_model_metrics, read_model_yaml

__all__ = [
    "ConfigError",
    "ModelSettings",
    "Settings",
    "describe_settings",
    "load",
    "parse_address",
    "parse_properties",
    "read_model_metrics",
    "read_model_yaml",
    "resolve_model_settings",
    "to_bool",
    "to_int",
]
