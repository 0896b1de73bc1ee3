# Placeholder: replaced by the compiled grouping core.
CORE_KIND = "compiled"
