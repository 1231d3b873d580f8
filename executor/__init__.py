"""The executor: trains a plan with megatron-core under torchrun, measures the machine (plan profile), and
calibrates and auto-tunes on what it measured. Imports only costmodel; torch and megatron lazily."""
