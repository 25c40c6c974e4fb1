"""What every mservd process does to itself: its log format, its lifeline to the daemon, and
the environment handler code may see."""
