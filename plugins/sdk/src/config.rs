//! The plugin's own table from `agl.toml`. Natively it is whatever the test
//! set with [`crate::testing::set_config_json`] (`{}` otherwise).

use serde::de::DeserializeOwned;

/// The config table as JSON text; `{}` when there is none.
pub fn config_json() -> String {
    #[cfg(target_arch = "wasm32")]
    return crate::bindings::adapter::agl::adapter::config::get();
    #[cfg(not(target_arch = "wasm32"))]
    return crate::testing::config_json();
}

/// The config table deserialised into `T`. Give `T` `#[serde(default)]` so
/// an empty table means "all defaults", and `deny_unknown_fields` so a typo
/// in `agl.toml` is an error rather than silently ignored.
pub fn config<T: DeserializeOwned>() -> Result<T, String> {
    let json = config_json();
    serde_json::from_str(&json).map_err(|e| format!("invalid plugin config: {e}"))
}
