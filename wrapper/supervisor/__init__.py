"""The per-job supervisor: started by the prolog, follows the job until it ends."""
