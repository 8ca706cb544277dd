"""What people read: the job report, its hints, and the rendering of both."""
