//! Config types as diffusers' `register_to_config` defines them: each field of a
//! `config.json` with the default of its `__init__` argument, one line a field.

/// A config struct whose fields each state their default (`name: Type = default`), as the
/// arguments of diffusers' `__init__` do. It is `Clone` and `Debug`, deserializes with a
/// missing field taking its default (`#[serde(default)]`), and `Default` gives every
/// field's default. Attributes and doc comments on the struct and its fields carry over
/// (`#[serde(skip)]`, `#[serde(flatten)]`, ...).
macro_rules! register_to_config {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field_vis:vis $field:ident: $ty:ty = $default:expr
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, serde::Deserialize)]
        #[serde(default)]
        $vis struct $name {
            $(
                $(#[$field_meta])*
                $field_vis $field: $ty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $($field: $default,)*
                }
            }
        }
    };
}

pub(crate) use register_to_config;
