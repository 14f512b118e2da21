"""Surviving faults: the guard (watchdog, SIGTERM, restarts), the agreed preemption step, injected faults."""
