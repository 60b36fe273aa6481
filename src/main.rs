//! `turnstile --config FILE` runs the gateway; `turnstile check FILE` validates a config.
//! Pingora's own flags (`--daemon`, `--upgrade`, `--test`, `--conf`) are accepted as well.

use clap::{Parser, Subcommand};
use pingora::server::configuration::Opt;
use std::path::PathBuf;
use std::process::ExitCode;
use turnstile::config::Config;

/// mimalloc instead of glibc's allocator: the proxy path allocates small short-lived buffers
/// per request, and the profile showed ~18% of CPU in glibc malloc/free (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "turnstile",
    version,
    about = "API gateway with exact, distributed rate limiting"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The turnstile TOML configuration file. `TURNSTILE_LISTEN` and `TURNSTILE_ADMIN_LISTEN`
    /// override its `server.listen` and `admin.listen`.
    #[arg(
        long,
        value_name = "FILE",
        env = "TURNSTILE_CONFIG",
        default_value = "conf/gateway.toml"
    )]
    config: PathBuf,
    #[command(flatten)]
    pingora: Opt,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file and exit (0 when valid).
    Check {
        /// The TOML file to check.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Check { file }) => check(&file),
        None => run(cli),
    }
}

fn check(file: &std::path::Path) -> ExitCode {
    let loaded = Config::load(file).and_then(|config| {
        // The certificates are read as a start or reload would.
        if let Some(tls) = &config.server.tls {
            turnstile::tls::CertStore::load(&tls.certificates)
                .map_err(turnstile::config::ConfigError::Invalid)?;
        }
        Ok(config)
    });
    match loaded {
        Ok(config) => {
            for warning in &config.warnings {
                eprintln!("warning: {}: {warning}", file.display());
            }
            println!(
                "{}: ok ({} routes, {} upstreams)",
                file.display(),
                config.routes.len(),
                config.upstreams.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            report_invalid(file, &e);
            ExitCode::from(2)
        }
    }
}

fn report_invalid(file: &std::path::Path, e: &turnstile::config::ConfigError) {
    eprintln!("error: invalid configuration {}:", file.display());
    for line in e.to_string().lines() {
        eprintln!("  {line}");
    }
}

fn run(cli: Cli) -> ExitCode {
    // The log format is the file's; an unreadable or invalid file is reported by `build`.
    let format = Config::load(&cli.config)
        .map(|c| c.server.log_format)
        .unwrap_or_default();
    turnstile::logging::init(format);
    match turnstile::server::build(&cli.config, cli.pingora) {
        Ok(server) => server.run_forever(),
        Err(e) => match e.downcast_ref::<turnstile::config::ConfigError>() {
            Some(invalid) => {
                report_invalid(&cli.config, invalid);
                ExitCode::from(2)
            }
            None => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
