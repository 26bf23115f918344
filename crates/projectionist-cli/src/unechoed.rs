//! A value parser for options that may hold a secret.

/// A value parser whose error names the option and what it expects, never the value given:
/// clap's own error quotes the argument, and a `--kafka-property` may hold a password.
/// `parse`'s error must not quote its input either.
#[derive(Clone)]
pub(crate) struct Unechoed<T> {
    parse: fn(&str) -> Result<T, String>,
}

impl<T> Unechoed<T> {
    pub(crate) const fn new(parse: fn(&str) -> Result<T, String>) -> Self {
        Self { parse }
    }
}

impl<T: Clone + Send + Sync + 'static> clap::builder::TypedValueParser for Unechoed<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let problem = match value.to_str() {
            Some(value) => match (self.parse)(value) {
                Ok(parsed) => return Ok(parsed),
                Err(problem) => problem,
            },
            None => "not UTF-8".to_owned(),
        };
        let arg = arg.map_or_else(String::new, |arg| format!(" for '{arg}'"));
        let message = format!("invalid value{arg} (not shown): {problem}\n");
        Err(clap::Error::raw(clap::error::ErrorKind::ValueValidation, message).with_cmd(cmd))
    }
}
