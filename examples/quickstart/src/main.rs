//! The projector: `migrate`, `create-topics`, `run`, `rebuild`, `publish`, `status`, `parked`,
//! `dead-letters` and `config example` (see `--help`).

use quickstart::Accounts;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    projectionist::cli::App::new("quickstart")
        .projection(Accounts, ["accounts"])
        .main()
        .await
}
