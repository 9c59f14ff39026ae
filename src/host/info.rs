//! The module's section of `INFO`: field after field, with the server's own prefix (`shard_`).

use redis_module::{raw, InfoContext};

/// The module's section, opened for the length of one INFO callback.
pub struct InfoSection<'a> {
    ctx: &'a InfoContext,
}

impl<'a> InfoSection<'a> {
    /// Opens the module's (only) section.
    pub fn open(ctx: &'a InfoContext) -> InfoSection<'a> {
        raw::add_info_section(ctx.ctx, None);
        InfoSection { ctx }
    }

    /// A text field (the server prints it as it is: no line breaks, no `:`-less assumptions).
    pub fn str(&self, name: &str, value: &str) {
        raw::add_info_field_str(self.ctx.ctx, name, value);
    }

    /// An integer field.
    pub fn int(&self, name: &str, value: i64) {
        raw::add_info_field_long_long(self.ctx.ctx, name, value);
    }
}
