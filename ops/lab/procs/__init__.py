"""Child processes, free loopback ports and process groups: what every lab tool starts things with."""
