//! The `turnstile` command: runs the gateway, or checks a configuration file.
//!
//! ```text
//! turnstile [-c FILE]                 run the gateway (FILE: --config, TURNSTILE_CONFIG, or
//!                                     /etc/turnstile/turnstile.toml)
//! turnstile check [-c FILE | FILE]    validate the file the gateway would run with, and exit
//! ```
//!
//! Exit codes: 0 ran and stopped cleanly / the file is valid; 2 the configuration cannot be
//! read or is invalid (every problem with its TOML path on stderr), or the command line is
//! wrong (clap's usage error); 1 anything else (a listener that cannot bind, a Pingora
//! setting file that does not load).

use clap::{Parser, Subcommand};
use pingora::server::configuration::Opt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use turnstile::config::{Config, ConfigError};

/// mimalloc instead of glibc's allocator: the proxy path allocates small short-lived buffers
/// per request, and the profile showed ~18% of CPU in glibc malloc/free (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Where the configuration is when nothing names one (the container image's path).
const DEFAULT_CONFIG: &str = "/etc/turnstile/turnstile.toml";

#[derive(Parser)]
#[command(
    name = "turnstile",
    version = turnstile::VERSION,
    about = "An API gateway with exact, distributed rate limiting",
    long_about = None,
    after_help = "\
Exit codes: 0 stopped cleanly, or (check) the configuration is valid; 2 the configuration \
cannot be read or is invalid (each problem with its TOML path), or the command line is \
wrong; 1 any other failure.

Signals: SIGHUP reloads the configuration; SIGTERM shuts down gracefully; SIGQUIT hands \
the listeners to a new process started with --upgrade; SIGINT stops at once.

TURNSTILE_LISTEN and TURNSTILE_ADMIN_LISTEN override server.listen and admin.listen."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The configuration file (TOML).
    #[arg(
        short = 'c',
        long,
        value_name = "FILE",
        env = "TURNSTILE_CONFIG",
        default_value = DEFAULT_CONFIG,
        global = true
    )]
    config: PathBuf,
    /// Run in the background (Pingora's daemon mode; the pid file is server.pid_file).
    #[arg(short, long)]
    daemon: bool,
    /// Take over the listeners of the running instance (through server.upgrade_sock), for a
    /// zero-downtime upgrade: start the new binary with this, then send SIGQUIT to the old one.
    #[arg(short, long)]
    upgrade: bool,
    /// A Pingora YAML file for the server settings turnstile does not model (threads, the
    /// pid file, the upgrade socket and the grace periods always come from the TOML file).
    #[arg(long, value_name = "YAML")]
    pingora_conf: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration file and exit (0 valid, 2 invalid).
    Check {
        /// The file to check (default: the one --config names).
        file: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::Check { file }) => check(file.as_deref().unwrap_or(&cli.config)),
        None => run(&cli),
    }
}

fn check(file: &Path) -> ExitCode {
    let loaded = Config::load(file).and_then(|config| {
        // The certificates are read as a start or reload would.
        if let Some(tls) = &config.server.tls {
            turnstile::tls::CertStore::load(&tls.certificates).map_err(ConfigError::Invalid)?;
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
            report(file, &e);
            ExitCode::from(2)
        }
    }
}

/// An unreadable file is said to be one; an invalid one lists its problems.
fn report(file: &Path, e: &ConfigError) {
    match e {
        ConfigError::Read { .. } => eprintln!("error: {e}"),
        _ => {
            eprintln!("error: invalid configuration {}:", file.display());
            for line in e.to_string().lines() {
                eprintln!("  {line}");
            }
        }
    }
}

fn run(cli: &Cli) -> ExitCode {
    // The log format is the file's; an unreadable or invalid file is reported by `build`.
    let format = Config::load(&cli.config)
        .map(|c| c.server.log_format)
        .unwrap_or_default();
    turnstile::logging::init(format);
    let opt = Opt {
        upgrade: cli.upgrade,
        daemon: cli.daemon,
        nocapture: false,
        test: false,
        conf: cli
            .pingora_conf
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned()),
    };
    match turnstile::server::build(&cli.config, opt) {
        Ok(server) => server.run_forever(),
        Err(e) => match e.downcast_ref::<ConfigError>() {
            Some(invalid) => {
                report(&cli.config, invalid);
                ExitCode::from(2)
            }
            None => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
