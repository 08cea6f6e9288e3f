//! Logging into the host's log, tagged with the plugin's name. Natively (in
//! `cargo test`) lines go to stderr and are kept for [`crate::testing::take_logs`].

pub use crate::bindings::adapter::agl::adapter::log::Level;

/// Logs `message` at `level`.
pub fn log(level: Level, message: impl AsRef<str>) {
    #[cfg(target_arch = "wasm32")]
    crate::bindings::adapter::agl::adapter::log::log(level, message.as_ref());
    #[cfg(not(target_arch = "wasm32"))]
    crate::testing::record_log(level, message.as_ref());
}

pub fn trace(message: impl AsRef<str>) {
    log(Level::Trace, message);
}

pub fn debug(message: impl AsRef<str>) {
    log(Level::Debug, message);
}

pub fn info(message: impl AsRef<str>) {
    log(Level::Info, message);
}

pub fn warn(message: impl AsRef<str>) {
    log(Level::Warn, message);
}

pub fn error(message: impl AsRef<str>) {
    log(Level::Error, message);
}
