"""SGLang 0.5.23 integration of Feather: `--schedule-policy feather` via the plugin or the source patch."""
