"""``t3ar bench job``: what a job costs through the stack compared with the adaptation in-process."""
