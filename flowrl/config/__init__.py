"""Configuration: the typed run schema (``schema``) and the strict YAML/dataclass loader it is built on (``loader``).

    from flowrl.config import load_config
    cfg = load_config("configs/default.yaml", ["train.lr=1e-4"])

Owns: every config field's type, default and validation; dotted ``key=value`` overrides; the resolved
``config.yaml`` a run writes and resume reads. Plugins (policies, kernels, windows, rewards, balancers,
objectives) own their own ``Config`` dataclasses; the schema reaches them through the registries.
"""
from flowrl.config.loader import (
    ConfigError,
    Plugin,
    Source,
    apply_overrides,
    build_plugin,
    dump_yaml,
    from_dict,
    load_yaml,
    parse_yaml,
    plugin_config_class,
    plugin_field,
    read_yaml_file,
    replace_nested,
    to_dict,
)
from flowrl.config.schema import (
    RunConfig,
    check_geometry,
    load_config,
    load_resolved,
    save_resolved,
)

__all__ = [
    "ConfigError", "Plugin", "RunConfig", "Source", "apply_overrides", "build_plugin", "check_geometry",
    "dump_yaml", "from_dict", "load_config", "load_resolved", "load_yaml", "parse_yaml", "plugin_config_class",
    "plugin_field", "read_yaml_file", "replace_nested", "save_resolved", "to_dict",
]
