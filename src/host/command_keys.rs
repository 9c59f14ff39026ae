//! Where a command's keys are, as the server finds them for these very arguments (its command
//! table and key specs: `EVAL`'s numkeys, `XREAD`'s `STREAMS`): `RedisModule_GetCommandKeys`,
//! its result copied out and freed in one place.

use std::io;
use std::os::raw::c_int;

use redis_module::raw;

/// Why the server gave no key positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoKeys {
    /// The server knows no such command.
    UnknownCommand,
    /// The arguments do not fit the command.
    WrongArity,
    /// The command has no key in these arguments.
    None,
}

/// The positions of the keys among `argv` (0 is the command's name), as the server gives
/// them. `ctx` is a live context (a command's, or the detached one) or null before load.
pub(crate) fn of(
    ctx: *mut raw::RedisModuleCtx,
    argv: &[*mut raw::RedisModuleString],
) -> Option<Vec<usize>> {
    positions(ctx, argv).ok()
}

/// As [`of`], saying why there are none.
pub(crate) fn positions(
    ctx: *mut raw::RedisModuleCtx,
    argv: &[*mut raw::RedisModuleString],
) -> Result<Vec<usize>, NoKeys> {
    let argc = c_int::try_from(argv.len()).map_err(|_| NoKeys::WrongArity)?;
    if ctx.is_null() || argv.is_empty() {
        return Err(NoKeys::None);
    }
    let mut num_keys: c_int = 0;
    // SAFETY: argv are live argument strings of the caller's command; the result is freed
    // below with RedisModule_Free.
    let (found, errno) = unsafe {
        let p = match (
            raw::RedisModule_GetCommandKeysWithFlags,
            raw::RedisModule_GetCommandKeys,
        ) {
            (Some(get), _) => get(
                ctx,
                argv.as_ptr().cast_mut(),
                argc,
                &mut num_keys,
                std::ptr::null_mut(),
            ),
            (None, Some(get)) => get(ctx, argv.as_ptr().cast_mut(), argc, &mut num_keys),
            (None, None) => std::ptr::null_mut(),
        };
        (p, io::Error::last_os_error().raw_os_error())
    };
    if found.is_null() {
        return Err(match errno {
            Some(libc::ENOENT) => NoKeys::UnknownCommand,
            Some(libc::EINVAL) => NoKeys::WrongArity,
            _ => NoKeys::None,
        });
    }
    // SAFETY: Redis returned num_keys positions; RedisModule_Free releases the array.
    let keys = unsafe {
        let n = usize::try_from(num_keys).unwrap_or(0);
        let v = std::slice::from_raw_parts(found, n)
            .iter()
            .filter_map(|&p| usize::try_from(p).ok())
            .collect();
        if let Some(free) = raw::RedisModule_Free {
            free(found.cast());
        }
        v
    };
    Ok(keys)
}

/// As [`positions`], for the command a call carries in its arguments from `from` on
/// (`SHARD.CALL cmd ...`: 1), counted from that command's name.
pub fn of_call(call: &crate::host::command::Call, from: usize) -> Result<Vec<usize>, NoKeys> {
    positions(
        call.ctx.ctx,
        call.args.raw().get(from..).unwrap_or_default(),
    )
}

/// As [`of`], for a command given as bytes (the name first), on the detached context.
pub fn of_bytes<A: AsRef<[u8]>>(args: &[A]) -> Option<Vec<usize>> {
    let ctx = crate::host::context::detached_raw();
    // SAFETY: the API table is filled at load; every string made here is freed before return.
    unsafe {
        let (Some(create), Some(free)) =
            (raw::RedisModule_CreateString, raw::RedisModule_FreeString)
        else {
            return None;
        };
        let argv: Vec<*mut raw::RedisModuleString> = args
            .iter()
            .map(|a| {
                create(
                    std::ptr::null_mut(),
                    a.as_ref().as_ptr().cast(),
                    a.as_ref().len(),
                )
            })
            .collect();
        let found = of(ctx, &argv);
        for s in argv {
            free(std::ptr::null_mut(), s);
        }
        found
    }
}
