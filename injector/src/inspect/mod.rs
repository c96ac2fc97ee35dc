//! Inspecting a process: its mappings, modules and functions.
