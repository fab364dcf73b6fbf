# Step 05's versions of definitions later steps change (see stack/README.md).


class _Body:
    def exit(self, exc):
        if self.ctx is None:
            return  # never entered
        ctx, self.ctx = self.ctx, None
        # Whole: inference_mode's guard restores more than the body carries.
        caller = self.capture()
        self.swap(self.state)
        try:
            if isinstance(exc, StopIteration):
                ctx.__exit__(None, None, None)
            else:
                return ctx.__exit__(type(exc), exc, exc.__traceback__)
        finally:
            self.swap(caller)
