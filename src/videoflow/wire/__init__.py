"""Wire format of the envelopes that travel on every edge."""
